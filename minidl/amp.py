"""The dtype policy of --amp: bf16 activations on the GPU, float32 everything that is kept.

Parameters, gradients, the optimizer's buffers, BN's γ, β and statistics, and the loss stay
float32. A bf16 model casts its activations to bf16 after the stem and back to float32 before
the classifier. bf16 values live in BF16 arrays, their raw bits, which no operation outside
minidl.kernels may treat as numbers. The policy is held by the model and the optimizer it is
enabled on, not by a global.

Details: docs/ops.md, "minidl/amp.py".
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
