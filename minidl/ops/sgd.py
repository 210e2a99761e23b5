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

On the CPU the update runs over blocks of the buffers in parallel (minidl.parallel), each block
going through all its passes while it is in cache, its temporaries in per-thread work arrays
(minidl.workspace): one trip through memory instead of one per pass. Every element sees the same operations in the same order as in one whole-buffer pass, so
the results are the same bit for bit (and the kernel's reference does not change).
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
