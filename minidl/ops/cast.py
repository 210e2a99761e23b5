"""The operations of the dtype policy (--amp; minidl.amp): casts into and out of bf16.

A model that computes in bf16 (its `compute_dtype`) casts its activations after the stem with
`to_compute_dtype` and back before the classifier with `to_float`. For a dtype of None, and for
data that is not bf16, both are the identity and record nothing: the CPU path and float32 runs
are exactly what they were without them. (Where a bf16 tensor feeds two operations, autograd
sums its two gradients with the bf16 kernel: minidl.autograd.)

bf16 exists only on the kernels: there is no reference implementation to fall back to.
"""
import numpy

from minidl import kernels
from minidl.autograd import Function
from minidl.backend import BF16


class Cast(Function):
    def __init__(self, kernels, dtype):
        self.kernels, self.dtype = kernels, dtype

    def forward(self, x):
        self.source = x.dtype
        return self.kernels.cast(x, self.dtype)

    def backward(self, gy):
        return self.kernels.cast(gy, self.source)


def _cast(x, dtype):
    serving = kernels.serving(x.data)
    if serving is None:
        raise TypeError(f"bf16 exists only on the GPU kernels: cannot cast {x.dtype} data to {numpy.dtype(dtype)} here")
    return Cast(serving, dtype)(x)


def to_compute_dtype(x, dtype):
    """x in `dtype` (bf16 under --amp; the gradient comes back as float32); x itself where
    `dtype` is None or x has it already."""
    return x if dtype is None or x.dtype == dtype else _cast(x, dtype)


def to_float(x):
    """x as float32 where it is bf16 (the gradient goes back as bf16); otherwise x itself."""
    return _cast(x, numpy.float32) if x.dtype == BF16 else x
