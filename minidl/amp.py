"""The dtype policy of --amp: bf16 activations on the GPU, float32 everything that is kept.

Parameters, their gradients, the optimizer's buffers, BN's γ, β and statistics, and the loss
stay float32 always. A model that computes in bf16 (`model.compute_dtype = BF16`; a ResNet)
casts its activations to bf16 after the stem (minidl.ops.to_compute_dtype) and back to float32
before the classifier (minidl.ops.to_float). In between every op has a bf16 kernel:
convolutions read bf16 activations and the bf16 copy of the float32 weights that the flat
parameter buffer keeps (refreshed once per step, minidl.optim.FlatParameters) and accumulate
in fp32 (grad-weight comes out float32, straight into the float32 gradient buffer); batch norm
(plain and fused with ReLU and the residual addition) reads bf16, computes in fp32 and writes
bf16; gradients flowing back between layers are bf16. bf16 values live in BF16 arrays, their
raw bits: NumPy and CuPy have no bfloat16 dtype, and no operation outside minidl.kernels may
treat those bits as numbers.

The policy is held by the model and the optimizer it is enabled on, not by a global: two
models in one process can compute in different precisions.
"""
from minidl import kernels
from minidl.backend import BF16
from minidl.errors import UserError


def enable(model, optimizer):
    """Make `model` compute in bf16 and `optimizer`'s flat buffer keep the bf16 weights it reads."""
    if kernels.active() is None:
        raise UserError("--amp needs a GPU, and this run has none (CuPy sees no usable GPU, or MINIDL_DEVICE=cpu, "
                        "or MINIDL_KERNELS=0): drop --amp to train on the CPU")
    if not hasattr(model, "compute_dtype"):
        raise TypeError(f"{type(model).__name__} has no compute_dtype: it cannot switch its activations to bf16")
    model.compute_dtype = BF16
    optimizer.flat.keep_bf16_copy()
