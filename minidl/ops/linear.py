"""Fully connected layer, torch's weight layout (out_features, in_features).

On the CPU the products run on all cores (minidl.parallel.matmul): an ImageNet classifier's
are a few hundred MFLOP. On a GPU the layer is what it is, a 1×1 convolution of N one-pixel
images (x as (N, 1, 1, in), w as (out, 1, 1, in)), and runs on the convolution kernels: cuBLAS,
which CuPy's matmul calls, cannot be captured in a CUDA graph (--cuda-graph)."""
from minidl import kernels
from minidl.autograd import Function
from minidl.parallel import matmul


def as_pixels(matrix):
    """(rows, features) as NHWC / KRSC (rows, 1, 1, features)."""
    return matrix.reshape(matrix.shape[0], 1, 1, matrix.shape[1])


class Linear(Function):
    def forward(self, x, w, b=None):
        self.x, self.w, self.has_bias = x, w, b is not None
        if kernels.wants(x, w):
            y = kernels.device().conv_forward(as_pixels(x), as_pixels(w), 1, 0).reshape(x.shape[0], w.shape[0])
        else:
            y = matmul(x, w.T)
        if b is not None:
            y += b
        return y

    def backward(self, gy):
        x, w = self.x, self.w
        if kernels.wants(gy, x, w):
            gpu = kernels.device()
            gx = gpu.conv_grad_input(as_pixels(gy), as_pixels(w), as_pixels(x).shape, 1, 0).reshape(x.shape)
            gw = gpu.conv_grad_weight(as_pixels(x), as_pixels(gy), as_pixels(w).shape, 1, 0).reshape(w.shape)
        else:
            gx, gw = matmul(gy, w), matmul(gy.T, x)
        return (gx, gw, gy.sum(axis=0)) if self.has_bias else (gx, gw)


def linear(x, w, b=None):
    """y = x @ w.T + b for x (N, in), w (out, in), b (out,)."""
    return Linear()(x, w) if b is None else Linear()(x, w, b)
