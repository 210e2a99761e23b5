"""Pooling over the spatial axes of NHWC tensors.

Max pooling loops over the R·S offsets of the window, each a strided slice of the input,
instead of reducing a 6-D window view: R·S full-array maximums are faster than one reduction
over two non-contiguous axes. Each slice is clipped to the image (minidl.ops.conv.window_range)
rather than padded with −∞: the same maximum, without a padded copy to make or keep. Backward
sends each output's gradient to the FIRST maximum of its window in (r, s) order, as torch
does, so ties (zeros after a ReLU) are routed the same way. Both directions run over chunks of
images in parallel (minidl.parallel).
"""
from minidl.backend import get_array_module
from minidl.ops.conv import output_size, window_range
from minidl.ops.dispatch import Op
from minidl.parallel import map_rows


def _offsets(kernel, stride, padding, in_hw, out_hw):
    """(output rows, input rows, output columns, input columns) as slices, for each window
    offset (r, s) in order, clipped to the image."""
    for r in range(kernel):
        rows = window_range(r - padding, stride, out_hw[0], in_hw[0])
        for s in range(kernel):
            columns = window_range(s - padding, stride, out_hw[1], in_hw[1])
            if rows and columns:
                yield rows[0], rows[1], columns[0], columns[1]


class MaxPool2d(Op):
    def __init__(self, kernel_size, stride, padding):
        self.kernel, self.stride, self.padding = kernel_size, stride, padding

    def forward_kernels(self, kernels, x):  # keeps the argmax bytes instead of the input
        self.x_shape = x.shape
        y, self.argmax = kernels.max_pool_forward(x, self.kernel, self.stride, self.padding)
        return y

    def backward_kernels(self, kernels, gy):
        return kernels.max_pool_backward(gy, self.argmax, self.x_shape, self.kernel, self.stride, self.padding)

    def forward_reference(self, x):
        xp = get_array_module(x)
        n, h, w, c = x.shape
        p = output_size(h, self.kernel, self.stride, self.padding)
        q = output_size(w, self.kernel, self.stride, self.padding)
        y = xp.empty((n, p, q, c), dtype=x.dtype)
        offsets = list(_offsets(self.kernel, self.stride, self.padding, (h, w), (p, q)))

        def chunk(x, y):
            y.fill(-xp.inf)
            for out_rows, in_rows, out_cols, in_cols in offsets:
                part = y[:, out_rows, out_cols, :]
                xp.maximum(part, x[:, in_rows, in_cols, :], out=part)

        map_rows(chunk, x, y)
        self.x, self.y, self.offsets = x, y, offsets
        return y

    def backward_reference(self, gy):
        xp = get_array_module(gy)
        gx = xp.empty(self.x.shape, dtype=gy.dtype)

        def chunk(gy, x, y, gx):
            gx.fill(0)
            unclaimed = xp.ones(gy.shape, dtype=bool)
            for out_rows, in_rows, out_cols, in_cols in self.offsets:
                outputs = (slice(None), out_rows, out_cols)
                first_max = (x[:, in_rows, in_cols, :] == y[outputs]) & unclaimed[outputs]
                gx[:, in_rows, in_cols, :] += gy[outputs] * first_max
                unclaimed[outputs] &= ~first_max

        map_rows(chunk, gy, self.x, self.y, gx)
        return gx


class GlobalAvgPool(Op):
    def forward_kernels(self, kernels, x):
        self.shape = x.shape
        return kernels.global_avg_pool_forward(x)

    def backward_kernels(self, kernels, gy):
        return kernels.global_avg_pool_backward(gy, self.shape)

    def forward_reference(self, x):
        self.shape = x.shape
        return x.mean(axis=(1, 2))

    def backward_reference(self, gy):
        xp = get_array_module(gy)
        n, h, w, c = self.shape
        return xp.broadcast_to((gy / (h * w))[:, None, None, :], self.shape).copy()


def max_pool2d(x, kernel_size, stride, padding=0):
    return MaxPool2d(kernel_size, stride, padding)(x)


def global_avg_pool(x):
    """(N, H, W, C) -> (N, C), the mean over H and W."""
    return GlobalAvgPool()(x)
