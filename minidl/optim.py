"""Optimizers (SGD, LARS) over ONE flat buffer of parameters and ONE flat buffer of gradients.

Every parameter's `.data` and `.grad` become views into two contiguous buffers, in
registration order and padded so any grid of ranks splits them evenly: the all-reduce sees one
array and the update is a few vectorized passes, with nothing packed per step. Weight decay is
a per-element vector (biases and norm parameters may get their own rate) and part of the
gradient; a CUDA-graph step stages its rate in device memory.

Details: docs/recipe.md, "minidl/optim.py".
"""
import numpy

from minidl import kernels
from minidl.autograd import Tensor
from minidl.backend import BF16, get_array_module
from minidl.intmath import round_up
from minidl.kernels.launch import data_address
from minidl.ops.sgd import sgd_momentum_update

EXEMPT_KINDS = ("bias", "norm")


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
        total = round_up(sum(sizes), align)
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
        self.bf16 = None  # the bf16 copy, once keep_bf16_copy() has made it

    def per_element(self, values):
        """A flat vector holding values[i] over the segment of parameter i (zero on the padding)."""
        host = numpy.zeros(len(self.data), dtype=self.data.dtype)
        for (start, end), value in zip(self.segments, values):
            host[start:end] = value
        return get_array_module(self.data).asarray(host)

    def zero_grad(self):
        self.grad.fill(0)

    def keep_bf16_copy(self):
        """Keep a bf16 copy of the buffer (bf16 bits; the kernels only) and make each parameter's
        `.bf16` a view into it: None where that view is not 16-byte aligned, which the
        tensor-core tiles need (the weight is then cast at use). Refresh it after every change of
        the buffer and before the next forward pass: a stale copy means stale weights."""
        if self.bf16 is not None:
            return
        self.bf16 = get_array_module(self.data).empty(self.data.shape, dtype=BF16)
        for p, (start, end) in zip(self.params, self.segments):
            view = self.bf16[start:end].reshape(p.shape)
            p.bf16 = view if data_address(view) % 16 == 0 else None

    def refresh_bf16_copy(self):
        """The bf16 copy ← the buffer (one cast kernel), where there is a copy."""
        if self.bf16 is not None:
            kernels.active().cast(self.data, BF16, out=self.bf16)


class FlatOptimizer:
    """What every optimizer here shares: the flat buffers, a momentum buffer, the per-element
    weight decay, and the knobs the trainer sets per step (`lr`, `grad_scale`)."""

    def __init__(self, params, lr, momentum, weight_decay, norm_weight_decay, grad_scale, align,
                 momentum_correction):
        self.flat = FlatParameters(params, align)
        self.lr, self.momentum, self.grad_scale = lr, momentum, grad_scale
        exempt_rate = weight_decay if norm_weight_decay is None else norm_weight_decay
        self.rates = [exempt_rate if self.is_exempt(p) else weight_decay for p in self.flat.params]
        self.decay = self.flat.per_element(self.rates) if any(self.rates) else None
        xp = get_array_module(self.flat.data)
        self.velocity = xp.zeros_like(self.flat.data)
        self.momentum_correction = momentum_correction
        self.previous_lr = None  # the rate of the last step, for updates with the rate inside v

    def velocity_correction(self):
        """The factor η_new/η_old that rescales a velocity holding the rate (Goyal et al.'s
        momentum correction; 1 on the first step, when η is unchanged or the correction is off);
        records this step's rate."""
        changed = self.momentum_correction and self.previous_lr not in (None, self.lr)
        correction = self.lr / self.previous_lr if changed else 1.0
        self.previous_lr = self.lr
        return correction

    @staticmethod
    def is_exempt(param):
        """Biases and normalization parameters: their own weight decay, no LARS scaling."""
        return getattr(param, "kind", "weight") in EXEMPT_KINDS

    @property
    def params(self):
        return self.flat.params

    def zero_grad(self):
        self.flat.zero_grad()


class SGD(FlatOptimizer):
    """SGD with momentum, d = s·g + λ·w (s = grad_scale, λ per parameter), in one of two forms
    (Goyal et al., remark 2; minidl/ops/sgd.py):
      form="pytorch":  u ← m·u + d;  w ← w − η·u   (nesterov: w ← w − η·(d + m·u))
      form="caffe2":   v ← m·v + η·d;  w ← w − v, and when η changes, v ← v·η_new/η_old first
                       (momentum correction; `momentum_correction=False` leaves it out)."""

    FORMS = ("pytorch", "caffe2")

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, nesterov=False,
                 norm_weight_decay=None, grad_scale=1.0, align=1024, form="pytorch", momentum_correction=True):
        if nesterov and (momentum <= 0 or form != "pytorch"):
            raise ValueError("nesterov momentum needs momentum > 0 and the pytorch form")
        if form not in self.FORMS:
            raise ValueError(f"unknown SGD form {form!r}; choose one of {self.FORMS}")
        super().__init__(params, lr, momentum, weight_decay, norm_weight_decay, grad_scale, align,
                         momentum_correction)
        self.nesterov, self.form = nesterov, form
        self.rate_inside = form == "caffe2"
        self.device_scalars = None  # (lr, grad_scale, velocity_scale) on the device, once stage_step() ran

    def step_scalars(self):
        """(lr, grad_scale, velocity_scale) of the update about to happen; records the rate for
        the momentum correction (in either form)."""
        correction = self.velocity_correction()
        return self.lr, self.grad_scale, correction if self.rate_inside else 1.0

    def step(self):
        lr, grad_scale, velocity_scale = self.step_scalars()
        sgd_momentum_update(self.flat.data, self.flat.grad, self.velocity, lr, self.momentum, grad_scale,
                            self.decay, self.nesterov, self.rate_inside, velocity_scale)

    def stage_step(self):
        """The host half of a step replayed from a CUDA graph: this step's scalars into
        `device_scalars`, in stream order (no host synchronization)."""
        kernels = _kernels_for_graphs()
        if self.device_scalars is None:
            self.device_scalars = get_array_module(self.flat.data).zeros(3, dtype=numpy.float32)
        kernels.store_sgd_scalars(self.device_scalars, *self.step_scalars())

    def step_from_device(self):
        """The device half: the update reading the staged scalars when it runs (what a graph
        captures; its launch arguments never change)."""
        if self.device_scalars is None:
            raise RuntimeError("step_from_device() reads the scalars that stage_step() stages: call it first")
        _kernels_for_graphs().sgd_momentum_update_from(self.device_scalars, self.flat.data, self.flat.grad,
                                                       self.velocity, self.momentum, self.decay, self.nesterov,
                                                       self.rate_inside)


def _kernels_for_graphs():
    active = kernels.active()
    if active is None:
        raise RuntimeError("the device half of a step (CUDA graphs) runs on the GPU kernels, and there are none")
    return active


class LARS(FlatOptimizer):
    """Layer-wise adaptive rate scaling (You, Gitman and Ginsburg, 2017).

    Each parameter tensor l gets its own rate, lr·trust_l, with
        trust_l = η·‖w_l‖ / (‖g_l‖ + λ_l·‖w_l‖)     (1 where a norm is 0, and for exempt tensors)
        v ← m·v + lr·trust·(g + λ·w);   w ← w − v      (g already multiplied by grad_scale)
    The per-tensor norms come from one weighted bincount over a per-element tensor index,
    so a step is a few passes over the flat buffers, never a loop over parameters. With the
    rate inside v, a change of lr rescales v by lr_new/lr_old (Goyal's momentum correction).
    """

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0, eta=0.001,
                 norm_weight_decay=None, grad_scale=1.0, align=1024, momentum_correction=True):
        super().__init__(params, lr, momentum, weight_decay, norm_weight_decay, grad_scale, align,
                         momentum_correction)
        xp = get_array_module(self.flat.data)
        self.eta = eta
        index = numpy.full(len(self.flat.data), len(self.flat.params), dtype=numpy.int32)  # padding
        for i, (start, end) in enumerate(self.flat.segments):
            index[start:end] = i
        self.tensor_index = xp.asarray(index)
        self.scaled = xp.asarray([not self.is_exempt(p) for p in self.flat.params] + [False])
        self.tensor_decay = xp.asarray(self.rates + [0.0], dtype=numpy.float64)
        self._scratch = xp.empty_like(self.flat.data)  # reused every step

    def tensor_norms(self, values):
        """‖values_l‖ for every tensor l (and the padding, last)."""
        xp = get_array_module(values)
        squares = xp.bincount(self.tensor_index, weights=values * values, minlength=len(self.scaled))
        return xp.sqrt(squares)

    def trust_ratios(self, g):
        xp = get_array_module(g)
        w_norm, g_norm = self.tensor_norms(self.flat.data), self.tensor_norms(g)
        denominator = g_norm + self.tensor_decay * w_norm
        usable = self.scaled & (w_norm > 0) & (denominator > 0)
        return xp.where(usable, self.eta * w_norm / xp.where(usable, denominator, 1.0), 1.0)

    def step(self):
        xp = get_array_module(self.flat.data)
        w, v, d = self.flat.data, self.velocity, self._scratch
        correction = self.velocity_correction()
        if correction != 1.0:
            v *= correction
        xp.multiply(self.flat.grad, self.grad_scale, out=d)
        rate = (self.lr * self.trust_ratios(d)).astype(w.dtype)[self.tensor_index]
        if self.decay is not None:
            d += self.decay * w
        d *= rate
        v *= self.momentum
        v += d
        w -= v
