"""The array module: CuPy on a GPU, NumPy otherwise. No other module decides the device.

`MINIDL_DEVICE=cpu|gpu` overrides the automatic choice; asking for a GPU where CuPy sees none
is a user error. Every other module writes `from minidl.backend import xp` and stays
agnostic of which library it got.

The dtype policy (--amp, GPU only). Parameters, their gradients, the optimizer's buffers, BN's
γ, β and statistics, and the loss stay float32 always. Inside `autocast()` the compute dtype
is bf16: the models cast their activations to it after the stem (minidl.ops.to_compute_dtype)
and back to float32 before the classifier (minidl.ops.to_float). In between every op has a bf16
kernel: convolutions read bf16 activations and a bf16 copy of the float32 weights made once
per step (minidl.kernels.Bf16Shadow) and accumulate in fp32 (grad-weight comes out float32,
straight into the float32 gradient buffer); batch norm (plain and fused with ReLU and the
residual addition) reads bf16, computes in fp32 and writes bf16; gradients flowing back between
layers are bf16. bf16 values live in `BF16` arrays, their raw bits: NumPy and CuPy have no
bfloat16 dtype, and no operation outside minidl.kernels may treat those bits as numbers.
"""
import contextlib
import os

import numpy

from minidl.errors import UserError


def _cupy_if_usable():
    try:
        import cupy
    except ImportError:
        return None
    try:
        return cupy if cupy.cuda.is_available() else None
    except Exception:  # a broken driver or runtime counts as no GPU
        return None


def _select():
    wanted = os.environ.get("MINIDL_DEVICE", "").strip().lower()
    if wanted not in ("", "cpu", "gpu"):
        raise UserError(f"MINIDL_DEVICE={wanted!r} is not a device: set it to cpu or gpu, or unset it")
    if wanted == "cpu":
        return numpy
    cupy = _cupy_if_usable()
    if wanted == "gpu" and cupy is None:
        raise UserError("MINIDL_DEVICE=gpu but CuPy sees no usable GPU: install cupy-cuda12x/13x "
                        "on a machine with a GPU, or set MINIDL_DEVICE=cpu")
    return cupy or numpy


xp = _select()
on_gpu = xp is not numpy
BF16 = numpy.uint16  # the container of bfloat16 bits
_compute_dtype = None  # BF16 inside autocast(); None: every op computes in its input's dtype


def compute_dtype():
    """BF16 inside `autocast()`, else None (the activations keep the model's own dtype)."""
    return _compute_dtype


@contextlib.contextmanager
def autocast(enabled=True):
    """Compute the activations in bf16 inside (--amp; GPU only). With enabled=False, a no-op."""
    global _compute_dtype
    if enabled:
        require_gpu("--amp")
    previous, _compute_dtype = _compute_dtype, BF16 if enabled else None
    try:
        yield
    finally:
        _compute_dtype = previous


def require_gpu(flag):
    """A user error where a GPU-only feature is asked for without a GPU."""
    if not on_gpu:
        raise UserError(f"{flag} needs a GPU, and this run has none (CuPy sees no usable GPU, or "
                        f"MINIDL_DEVICE=cpu): drop {flag} to train on the CPU")


def to_numpy(array):
    """A NumPy copy (or the array itself) of an xp array, for printing, saving and tests."""
    if isinstance(array, numpy.ndarray):
        return array
    return array.get() if hasattr(array, "get") else numpy.asarray(array)


def get_array_module(array):
    """NumPy or CuPy, whichever owns `array` (DeZero's trick for one code path)."""
    return numpy if isinstance(array, numpy.ndarray) or numpy.isscalar(array) else xp


def select_device(local_rank):
    """Bind this process to GPU `local_rank % device_count` (no-op on CPU); call before any allocation."""
    if on_gpu:
        xp.cuda.Device(local_rank % xp.cuda.runtime.getDeviceCount()).use()


def synchronize():
    """Wait until the device has finished the work queued so far (a no-op on CPU)."""
    if on_gpu:
        xp.cuda.Device().synchronize()
