"""Launcher of kernels/pool.cu: max pooling (with a one-byte argmax) and global average
pooling, forward and backward; float32 only."""
import numpy

from minidl.backend import get_array_module
from minidl.kernels.launch import Launcher, i32, require_float32

FAMILY = "pool"
THREADS = 256
DEFINES = {"POOL_THREADS": THREADS}
NAMES = ("max_pool_forward", "max_pool_backward", "global_avg_pool_forward", "global_avg_pool_backward")


class PoolKernels(Launcher):
    def _pool(self, name, count, args):
        self.launch(FAMILY, name, self.elementwise_grid(count, THREADS), (THREADS,), args)

    def max_pool_forward(self, x, kernel, stride, padding):
        """(y, argmax): argmax holds each window's first maximum as r·kernel + s (uint8)."""
        require_float32(x)
        xp = get_array_module(x)
        n, h, w, c = x.shape
        p, q = (h + 2 * padding - kernel) // stride + 1, (w + 2 * padding - kernel) // stride + 1
        y, argmax = xp.empty((n, p, q, c), dtype=x.dtype), xp.empty((n, p, q, c), dtype=numpy.uint8)
        self._pool("max_pool_forward", y.size, (x, y, argmax, *i32(n, h, w, c, p, q, kernel, stride, padding)))
        return y, argmax

    def max_pool_backward(self, gy, argmax, x_shape, kernel, stride, padding):
        require_float32(gy)
        n, h, w, c = x_shape
        gx = get_array_module(gy).empty(x_shape, dtype=gy.dtype)
        self._pool("max_pool_backward", gx.size,
                   (gy, argmax, gx, *i32(n, h, w, c, gy.shape[1], gy.shape[2], kernel, stride, padding)))
        return gx

    def global_avg_pool_forward(self, x):
        require_float32(x)
        n, h, w, c = x.shape
        y = get_array_module(x).empty((n, c), dtype=x.dtype)
        self._pool("global_avg_pool_forward", n * c, (x, y, *i32(n, h * w, c)))
        return y

    def global_avg_pool_backward(self, gy, x_shape):
        require_float32(gy)
        n, h, w, c = x_shape
        gx = get_array_module(gy).empty(x_shape, dtype=gy.dtype)
        self._pool("global_avg_pool_backward", gx.size, (gy, gx, *i32(n, h * w, c)))
        return gx
