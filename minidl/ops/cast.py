"""The operations of the dtype policy (minidl.backend.autocast): casts into and out of bf16.

Outside autocast, and for data that is not bf16, both are the identity and record nothing: the
CPU path and float32 runs are exactly what they were without them. (Where a bf16 tensor feeds two
operations, autograd sums its two gradients with the bf16 kernel: minidl.autograd.)
"""
import numpy

from minidl import kernels
from minidl.autograd import Function
from minidl.backend import BF16, compute_dtype


class Cast(Function):
    def __init__(self, dtype):
        self.dtype = dtype

    def forward(self, x):
        self.source = x.dtype
        return kernels.device().cast(x, self.dtype)

    def backward(self, gy):
        return kernels.device().cast(gy, self.source)


def _cast(x, dtype):
    if not kernels.wants(x.data):
        raise TypeError(f"bf16 exists only on the GPU kernels: cannot cast {x.dtype} data to {numpy.dtype(dtype)} here")
    return Cast(dtype)(x)


def to_compute_dtype(x):
    """x in bf16 inside autocast (the gradient comes back as float32); otherwise x itself."""
    wanted = compute_dtype()
    return x if wanted is None or x.dtype == wanted else _cast(x, wanted)


def to_float(x):
    """x as float32 where it is bf16 (the gradient goes back as bf16); otherwise x itself."""
    return _cast(x, numpy.float32) if x.dtype == BF16 else x

