"""The array module: CuPy on a GPU, NumPy otherwise. No other module decides the device.

`MINIDL_DEVICE=cpu|gpu` overrides the automatic choice; asking for a GPU where CuPy sees none
is a user error. Every other module writes `from minidl.backend import xp` and stays
agnostic of which library it got.

`BF16` is the container of bfloat16 values (their raw bits, see minidl.amp): NumPy and CuPy
have no bfloat16 dtype.
"""
import numpy

from minidl import environment
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
    wanted = environment.value("MINIDL_DEVICE")
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
