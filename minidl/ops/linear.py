"""Fully connected layer, torch's weight layout (out_features, in_features)."""
from minidl.autograd import Function


class Linear(Function):
    def forward(self, x, w, b=None):
        self.x, self.w, self.has_bias = x, w, b is not None
        y = x @ w.T
        if b is not None:
            y += b
        return y

    def backward(self, gy):
        gx, gw = gy @ self.w, gy.T @ self.x
        return (gx, gw, gy.sum(axis=0)) if self.has_bias else (gx, gw)


def linear(x, w, b=None):
    """y = x @ w.T + b for x (N, in), w (out, in), b (out,)."""
    return Linear()(x, w) if b is None else Linear()(x, w, b)
