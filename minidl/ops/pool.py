"""Pooling over the spatial axes of NHWC tensors.

Max pooling loops over the R·S offsets of the window, each a strided slice of the padded
input, instead of reducing a 6-D window view: R·S full-array maximums are faster than one
reduction over two non-contiguous axes. Backward sends each output's gradient to the FIRST
maximum of its window in (r, s) order, as torch does, so ties (zeros after a ReLU) are
routed the same way.
"""
from minidl import kernels
from minidl.autograd import Function
from minidl.backend import get_array_module
from minidl.ops.conv import output_size, pad_hw


def _offsets(kernel, stride, p, q):
    """(r, s, slice_h, slice_w): each window offset as a strided slice of the padded input."""
    for r in range(kernel):
        for s in range(kernel):
            yield r, s, slice(r, r + stride * (p - 1) + 1, stride), slice(s, s + stride * (q - 1) + 1, stride)


class MaxPool2d(Function):
    def __init__(self, kernel_size, stride, padding):
        self.kernel, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        if kernels.wants(x):  # keeps the argmax bytes instead of the padded input
            self.x_shape = x.shape
            y, self.argmax = kernels.device().max_pool_forward(x, self.kernel, self.stride, self.padding)
            return y
        xp = get_array_module(x)
        n, h, w, c = x.shape
        p = output_size(h, self.kernel, self.stride, self.padding)
        q = output_size(w, self.kernel, self.stride, self.padding)
        x_padded = pad_hw(x, self.padding, value=-xp.inf)
        y = None
        for _, _, rows, cols in _offsets(self.kernel, self.stride, p, q):
            window = x_padded[:, rows, cols, :]
            y = window.copy() if y is None else xp.maximum(y, window, out=y)
        self.x_padded, self.x_shape, self.y = x_padded, x.shape, y
        return y

    def backward(self, gy):
        if hasattr(self, "argmax"):
            return kernels.device().max_pool_backward(gy, self.argmax, self.x_shape, self.kernel, self.stride,
                                                      self.padding)
        xp = get_array_module(gy)
        _, p, q, _ = gy.shape
        gx = xp.zeros(self.x_padded.shape, dtype=gy.dtype)
        unclaimed = xp.ones(gy.shape, dtype=bool)
        for _, _, rows, cols in _offsets(self.kernel, self.stride, p, q):
            first_max = (self.x_padded[:, rows, cols, :] == self.y) & unclaimed
            gx[:, rows, cols, :] += gy * first_max
            unclaimed &= ~first_max
        h, w = self.x_shape[1:3]
        pad = self.padding
        return gx[:, pad:pad + h, pad:pad + w, :]


class GlobalAvgPool(Function):
    def forward(self, x):
        self.shape = x.shape
        if kernels.wants(x):
            return kernels.device().global_avg_pool_forward(x)
        return x.mean(axis=(1, 2))

    def backward(self, gy):
        if kernels.wants(gy):
            return kernels.device().global_avg_pool_backward(gy, self.shape)
        xp = get_array_module(gy)
        n, h, w, c = self.shape
        return xp.broadcast_to((gy / (h * w))[:, None, None, :], self.shape).copy()


def max_pool2d(x, kernel_size, stride, padding=0):
    return MaxPool2d(kernel_size, stride, padding)(x)


def global_avg_pool(x):
    """(N, H, W, C) -> (N, C), the mean over H and W."""
    return GlobalAvgPool()(x)
