"""Elementwise activations, in parallel row chunks (minidl.parallel)."""
from minidl.autograd import Function
from minidl.backend import get_array_module
from minidl.parallel import map_rows


class ReLU(Function):
    def forward(self, x):
        xp = get_array_module(x)
        y = xp.empty_like(x)
        map_rows(lambda rows, out: xp.maximum(rows, 0, out=out), x, y)
        self.y = y
        return y

    def backward(self, gy):
        xp = get_array_module(gy)
        gx = xp.empty_like(gy)
        map_rows(lambda g, y, out: xp.multiply(g, y > 0, out=out), gy, self.y, gx)
        return gx


def relu(x):
    return ReLU()(x)
