"""Optimizers over ONE flat buffer of parameters and ONE flat buffer of gradients.

At construction every parameter's `.data` and `.grad` are re-pointed to views into two
contiguous buffers, in the order the parameters are given (registration order), padded to a
multiple of `align` elements so that any grid of ranks can split them evenly. From then on
the whole model is one array: the all-reduce sees one buffer, the update is a handful of
vectorized passes, and nothing is packed or unpacked per step.

Weight decay is a per-element vector, built once from each parameter's `kind`: biases and
normalization parameters can get their own rate (`norm_weight_decay`, e.g. 0 as in Goyal et
al.), everything else gets `weight_decay`. Weight decay is part of the gradient (Goyal's
remark 1), applied after `grad_scale` (which folds e.g. 1/world_size into the update).
"""
import numpy

from minidl.autograd import Tensor
from minidl.backend import get_array_module
from minidl.ops.sgd import sgd_momentum_update

EXEMPT_KINDS = ("bias", "norm")


def padded_size(count, align):
    return -(-count // align) * align


class FlatParameters:
    """Flat data and grad buffers with every parameter's arrays as views into them."""

    def __init__(self, params, align=1024):
        self.params = list(params)
        if not self.params:
            raise ValueError("the optimizer got no parameters")
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError("a parameter is listed twice")
        first = self.params[0].data
        xp, dtype = get_array_module(first), first.dtype
        sizes = [p.size for p in self.params]
        total = padded_size(sum(sizes), align)
        self.data = xp.zeros(total, dtype=dtype)
        self.grad = xp.zeros(total, dtype=dtype)
        self.segments = []  # (start, end) of each parameter, in order
        start = 0
        for p, size in zip(self.params, sizes):
            end = start + size
            self.data[start:end] = p.data.reshape(-1)
            p.data = self.data[start:end].reshape(p.shape)
            p.grad = Tensor(self.grad[start:end].reshape(p.shape))
            self.segments.append((start, end))
            start = end
        self.size = start  # elements in use; the rest is zero padding

    def per_element(self, values):
        """A flat vector holding values[i] over the segment of parameter i (zero on the padding)."""
        host = numpy.zeros(len(self.data), dtype=self.data.dtype)
        for (start, end), value in zip(self.segments, values):
            host[start:end] = value
        return get_array_module(self.data).asarray(host)

    def zero_grad(self):
        self.grad.fill(0)


class SGD:
    """SGD with momentum in torch's form:  u ← m·u + (s·g + λ·w);  w ← w − η·u
    (nesterov: w ← w − η·(s·g + λ·w + m·u)), s = grad_scale, λ per parameter."""

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, nesterov=False,
                 norm_weight_decay=None, grad_scale=1.0, align=1024):
        if nesterov and momentum <= 0:
            raise ValueError("nesterov momentum needs momentum > 0")
        self.flat = FlatParameters(params, align)
        self.lr, self.momentum, self.nesterov, self.grad_scale = lr, momentum, nesterov, grad_scale
        exempt_rate = weight_decay if norm_weight_decay is None else norm_weight_decay
        rates = [exempt_rate if getattr(p, "kind", "weight") in EXEMPT_KINDS else weight_decay
                 for p in self.flat.params]
        self.decay = self.flat.per_element(rates) if any(rates) else None
        xp = get_array_module(self.flat.data)
        self.velocity = xp.zeros_like(self.flat.data)
        self._scratch = xp.empty_like(self.flat.data)  # reused every step

    @property
    def params(self):
        return self.flat.params

    def zero_grad(self):
        self.flat.zero_grad()

    def step(self):
        sgd_momentum_update(self.flat.data, self.flat.grad, self.velocity, self._scratch, self.lr,
                            self.momentum, self.grad_scale, self.decay, self.nesterov)
