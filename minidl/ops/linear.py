"""Fully connected layer, torch's weight layout (out_features, in_features).

On the CPU the products run on all cores (minidl.parallel.matmul): an ImageNet classifier's
are a few hundred MFLOP. On a GPU the layer is what it is, a 1×1 convolution of N one-pixel
images (x as (N, 1, 1, in), w as (out, 1, 1, in)), and runs on the convolution kernels: cuBLAS,
which CuPy's matmul calls, cannot be captured in a CUDA graph (--cuda-graph)."""
from minidl.ops.bias import add_bias, with_bias_grad
from minidl.ops.dispatch import Op
from minidl.parallel import matmul


def as_pixels(matrix):
    """(rows, features) as NHWC / KRSC (rows, 1, 1, features)."""
    return matrix.reshape(matrix.shape[0], 1, 1, matrix.shape[1])


class Linear(Op):
    def forward_reference(self, x, w, b=None):
        self.x, self.w, self.has_bias = x, w, b is not None
        return add_bias(matmul(x, w.T), b)

    def backward_reference(self, gy):
        return with_bias_grad(gy, self.has_bias, matmul(gy, self.w), matmul(gy.T, self.x))

    def forward_kernels(self, kernels, x, w, b=None):
        self.x, self.w, self.has_bias = x, w, b is not None
        return add_bias(kernels.conv_forward(as_pixels(x), as_pixels(w), 1, 0).reshape(x.shape[0], w.shape[0]), b)

    def backward_kernels(self, kernels, gy):
        x, w = self.x, self.w
        gx = kernels.conv_grad_input(as_pixels(gy), as_pixels(w), as_pixels(x).shape, 1, 0).reshape(x.shape)
        gw = kernels.conv_grad_weight(as_pixels(x), as_pixels(gy), as_pixels(w).shape, 1, 0).reshape(w.shape)
        return with_bias_grad(gy, self.has_bias, gx, gw)


def linear(x, w, b=None):
    """y = x @ w.T + b for x (N, in), w (out, in), b (out,)."""
    return Linear()(x, w) if b is None else Linear()(x, w, b)
