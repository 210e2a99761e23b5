"""The fused SGD-momentum update over the flat buffers (the reference for kernels/sgd.cu).

One call updates the whole model, with the rate outside the velocity (PyTorch) or inside it
(Caffe2; the velocity is then rescaled by c = η_new/η_old when the rate changes, Goyal et al.'s
momentum correction). On the CPU it runs over blocks of the buffers in parallel, each block
through all its passes while in cache; every element sees the same operations in the same
order as in one whole-buffer pass, so the results are the same bit for bit.

Details: docs/ops.md, "minidl/ops/sgd.py".
"""
from minidl import kernels, workspace
from minidl.backend import get_array_module
from minidl.parallel import map_rows

BLOCK_BYTES = 4 << 20  # all the buffers' share of one block: each pass over it is long enough to run in parallel


def sgd_momentum_update(w, g, u, lr, momentum, grad_scale=1.0, decay=None, nesterov=False,
                        rate_inside=False, velocity_scale=1.0):
    if nesterov and rate_inside:
        raise ValueError("nesterov momentum is defined for the rate-outside form only")
    serving = kernels.serving(w, g, u, decay)
    if serving is not None:  # one pass in kernels/sgd.cu
        return serving.sgd_momentum_update(w, g, u, lr, momentum, grad_scale, decay, nesterov, rate_inside,
                                           velocity_scale)

    def update(w, g, u, decay=None):
        _update_block(w, g, u, lr, momentum, grad_scale, decay, nesterov, rate_inside, velocity_scale)

    map_rows(update, *(a for a in (w, g, u, decay) if a is not None), chunk_bytes=BLOCK_BYTES)


def _update_block(w, g, u, lr, momentum, grad_scale, decay, nesterov, rate_inside, velocity_scale):
    """The update on one block of the buffers (decay: the block's rates, or None)."""
    xp = get_array_module(w)
    d = workspace.scratch("sgd_d", w.shape, w)
    xp.multiply(g, grad_scale, out=d)
    if decay is not None:
        d += _times(decay, w)
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
        d += _times(u, momentum)
        d *= lr
    else:
        xp.multiply(u, lr, out=d)
    w -= d


def _times(a, b):
    """a · b in a per-thread work array (the product a whole-buffer pass would allocate)."""
    product = workspace.scratch("sgd", a.shape, a)
    get_array_module(a).multiply(a, b, out=product)
    return product
