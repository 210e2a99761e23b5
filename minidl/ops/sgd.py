"""The fused SGD-momentum update over the flat buffers (the reference for kernels/sgd.cu).

One call updates the whole model: w, g, u are the flat parameter, gradient and momentum
buffers, `decay` the per-element weight-decay rate (or None). With d = s·g + λ·w (s =
grad_scale; weight decay is part of the gradient, Goyal et al.'s remark 1), two forms:

    rate outside (PyTorch, Goyal's eq. 9):   u ← m·u + d;          w ← w − η·u
                                             (nesterov: w ← w − η·(d + m·u))
    rate inside (Caffe2, Goyal's eq. 10):    u ← (c·u)·m + η·d;    w ← w − u

In the second form the velocity carries the rate, so when η changes it must be rescaled by
c = η_new/η_old (Goyal's momentum correction; the optimizer passes c, 1 when η is unchanged).
With it the two forms take the same steps; without it a rate jump is applied late and wrong.

`scratch` is a buffer of the same size reused across steps.
"""
from minidl import kernels
from minidl.backend import get_array_module


def sgd_momentum_update(w, g, u, scratch, lr, momentum, grad_scale=1.0, decay=None, nesterov=False,
                        rate_inside=False, velocity_scale=1.0):
    if nesterov and rate_inside:
        raise ValueError("nesterov momentum is defined for the rate-outside form only")
    if kernels.wants(w, g, u, decay):  # one pass in kernels/sgd.cu, scratch unused
        return kernels.device().sgd_momentum_update(w, g, u, lr, momentum, grad_scale, decay, nesterov,
                                                    rate_inside, velocity_scale)
    xp = get_array_module(w)
    d = scratch
    xp.multiply(g, grad_scale, out=d)
    if decay is not None:
        d += decay * w
    if rate_inside:
        u *= velocity_scale
        u *= momentum
        d *= lr
        u += d
        w -= u
        return
    u *= momentum
    u += d
    if nesterov:
        d += momentum * u
        d *= lr
    else:
        xp.multiply(u, lr, out=d)
    w -= d
