"""Fully connected layer, torch's weight layout (out_features, in_features). The products run
on all cores (minidl.parallel.matmul): an ImageNet classifier's are a few hundred MFLOP."""
from minidl.autograd import Function
from minidl.parallel import matmul


class Linear(Function):
    def forward(self, x, w, b=None):
        self.x, self.w, self.has_bias = x, w, b is not None
        y = matmul(x, w.T)
        if b is not None:
            y += b
        return y

    def backward(self, gy):
        gx, gw = matmul(gy, self.w), matmul(gy.T, self.x)
        return (gx, gw, gy.sum(axis=0)) if self.has_bias else (gx, gw)


def linear(x, w, b=None):
    """y = x @ w.T + b for x (N, in), w (out, in), b (out,)."""
    return Linear()(x, w) if b is None else Linear()(x, w, b)
