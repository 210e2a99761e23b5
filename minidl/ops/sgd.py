"""The fused SGD-momentum update over the flat buffers (the reference for kernels/sgd.cu).

One call updates the whole model: w, g, u are the flat parameter, gradient and momentum
buffers, `decay` the per-element weight-decay rate (or None).

    d = s·g + λ·w          (s = grad_scale; weight decay is part of the gradient)
    u ← m·u + d
    w ← w − η·u            (nesterov: w ← w − η·(d + m·u))

`scratch` is a buffer of the same size reused across steps.
"""
from minidl import kernels
from minidl.backend import get_array_module


def sgd_momentum_update(w, g, u, scratch, lr, momentum, grad_scale=1.0, decay=None, nesterov=False):
    if kernels.wants(w, g, u, decay):  # one pass in kernels/sgd.cu, scratch unused
        return kernels.device().sgd_momentum_update(w, g, u, lr, momentum, grad_scale, decay, nesterov)
    xp = get_array_module(w)
    d = scratch
    xp.multiply(g, grad_scale, out=d)
    if decay is not None:
        d += decay * w
    u *= momentum
    u += d
    if nesterov:
        d += momentum * u
        d *= lr
    else:
        xp.multiply(u, lr, out=d)
    w -= d
