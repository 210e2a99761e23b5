"""Launcher of kernels/amp.cu: float32 <-> bf16 casts and the sum of two bf16 arrays (--amp).

bf16 data are BF16 arrays holding the raw bfloat16 bits (NumPy and CuPy have no bfloat16
dtype): no operation outside the kernels may treat those bits as numbers.
"""
import numpy

from minidl.backend import BF16, get_array_module
from minidl.kernels.launch import Launcher

FAMILY = "amp"
THREADS = 256
DEFINES = {"AMP_THREADS": THREADS}
NAMES = ("float_to_bf16", "bf16_to_float", "bf16_add")
CASTS = {(numpy.dtype(numpy.float32), numpy.dtype(BF16)): "float_to_bf16",
         (numpy.dtype(BF16), numpy.dtype(numpy.float32)): "bf16_to_float"}


class AmpKernels(Launcher):
    def cast(self, x, dtype, out=None):
        """x as float32 or bf16 (BF16 bits): to bf16 rounds to nearest even, to float32 is exact."""
        if x.dtype == dtype and out is None:
            return x
        name = CASTS.get((x.dtype, numpy.dtype(dtype)))
        if name is None:
            raise TypeError(f"the cast kernels convert between float32 and bf16, not {x.dtype} to {dtype}")
        xp = get_array_module(x)
        x = xp.ascontiguousarray(x)
        y = xp.empty(x.shape, dtype=dtype) if out is None else out
        if y.shape != x.shape or y.dtype != dtype:
            raise ValueError(f"cast: out is {y.dtype} {y.shape}, {numpy.dtype(dtype)} {x.shape} expected")
        self.launch(FAMILY, name, self.elementwise_grid(x.size, THREADS), (THREADS,), (x, y, numpy.int64(x.size)))
        return y

    def bf16_add(self, a, b):
        """a + b of two bf16 arrays, summed in fp32 and rounded once."""
        if a.dtype != BF16 or b.dtype != BF16 or a.shape != b.shape:
            raise TypeError(f"bf16_add adds two bf16 arrays of one shape, not {a.dtype} {a.shape} "
                            f"and {b.dtype} {b.shape}")
        xp = get_array_module(a)
        a, b = xp.ascontiguousarray(a), xp.ascontiguousarray(b)
        y = xp.empty_like(a)
        self.launch(FAMILY, "bf16_add", self.elementwise_grid(a.size, THREADS), (THREADS,),
                    (a, b, y, numpy.int64(a.size)))
        return y
