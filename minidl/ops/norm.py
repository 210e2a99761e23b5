"""Batch normalization over N·H·W of an NHWC tensor, torch's conventions.

Training: normalize with the batch mean and the biased batch variance; update the running
statistics in place with momentum, the running variance from the UNBIASED batch variance.
Evaluation: normalize with the running statistics.

Both modes reduce to one affine map per channel, y = x·scale + shift, so the forward pass
never materializes x̂. The backward pass likewise folds into dx = gy·scale + x·c1 + c0 with
per-channel c1, c0 (derivation in `backward`), needing only two reductions over the batch:
Σ gy and Σ gy·x. The variance is two-pass (Σ (x − mean)²), safe where |mean| ≫ std.

With channels last an NHWC tensor is an (N·H·W, C) matrix: every pass runs over chunks of
its rows in parallel (minidl.parallel), and per-channel sums are products with a ones vector.
"""
from minidl import kernels
from minidl.autograd import Function
from minidl.backend import get_array_module
from minidl.parallel import map_rows, sum_rows


def column_sums(a):
    """Σ over rows of a (rows, C) matrix, as a BLAS product (faster than sum(axis=0) for small C)."""
    return get_array_module(a).ones(a.shape[0], dtype=a.dtype) @ a


def column_dots(a, b):
    """Σ over rows of a·b, per column."""
    return get_array_module(a).einsum("ij,ij->j", a, b)


def affine(x2, scale, shift):
    """x·scale + shift per channel, written into a new array chunk by chunk."""
    xp = get_array_module(x2)
    y = xp.empty_like(x2)

    def chunk(x_rows, y_rows):
        xp.multiply(x_rows, scale, out=y_rows)
        y_rows += shift

    map_rows(chunk, x2, y)
    return y


class BatchNorm(Function):
    def __init__(self, running_mean, running_var, training, momentum, eps):
        self.running_mean, self.running_var = running_mean, running_var
        self.training, self.momentum, self.eps = training, momentum, eps

    def forward(self, x, gamma, beta):
        if kernels.wants(x, gamma, beta, self.running_mean, self.running_var):
            self.x = x
            y, self.saved = kernels.device().batch_norm_forward(
                x, gamma, beta, self.running_mean, self.running_var, self.training, self.momentum, self.eps)
            return y
        xp = get_array_module(x)
        x2 = x.reshape(-1, x.shape[-1])
        if self.training:
            count = x2.shape[0]
            mean = sum_rows(column_sums, x2) / count

            def squared_deviations(rows):
                centered = rows - mean
                return column_dots(centered, centered)

            var = sum_rows(squared_deviations, x2) / count
            if self.running_mean is not None:
                self._update_running(mean, var * (count / max(count - 1, 1)))
        else:
            mean, var = self.running_mean, self.running_var
        inv_std = 1.0 / xp.sqrt(var + self.eps)
        scale = gamma * inv_std
        self.x, self.mean, self.inv_std, self.scale = x, mean, inv_std, scale
        return affine(x2, scale, beta - mean * scale).reshape(x.shape)

    def _update_running(self, mean, unbiased_var):
        m = self.momentum
        self.running_mean *= 1 - m
        self.running_mean += m * mean
        self.running_var *= 1 - m
        self.running_var += m * unbiased_var

    def backward(self, gy):
        if hasattr(self, "saved"):  # the forward ran on the kernels
            return kernels.device().batch_norm_backward(gy, self.x, self.saved, self.training)[:3]
        xp = get_array_module(gy)
        channels = gy.shape[-1]
        gy2, x2 = gy.reshape(-1, channels), self.x.reshape(-1, channels)
        mean, inv_std, scale = self.mean, self.inv_std, self.scale
        count = gy2.shape[0]
        # dβ = Σ gy;  dγ = Σ gy·x̂ = inv_std·(Σ gy·x − mean·Σ gy)
        gbeta, gy_dot_x = sum_rows(lambda g, x: xp.stack([column_sums(g), column_dots(g, x)]), gy2, x2)
        ggamma = inv_std * (gy_dot_x - mean * gbeta)
        if not self.training:  # the statistics are constants: dx = gy·scale
            return affine(gy2, scale, 0).reshape(gy.shape), ggamma, gbeta
        # dx = scale·(gy − dβ/M − x̂·dγ/M), with x̂ = (x − mean)·inv_std, regrouped as
        # dx = gy·scale + x·c1 + c0
        c1 = -scale * inv_std * ggamma / count
        c0 = -scale * gbeta / count - c1 * mean
        gx = xp.empty_like(gy2)

        def chunk(g, x, out):
            xp.multiply(g, scale, out=out)
            out += x * c1
            out += c0

        map_rows(chunk, gy2, x2, gx)
        return gx.reshape(gy.shape), ggamma, gbeta


class GhostBatchNorm(Function):
    """Batch norm with statistics over groups of `group_size` consecutive images ("ghost" batch
    norm; Goyal et al. normalize over 32 images per worker whatever the batch): each group is
    normalized as a batch of its own, and updates the running statistics in turn."""

    def __init__(self, group_size, *batch_norm_args):
        self.group_size, self.batch_norm_args = group_size, batch_norm_args

    def _parts(self, n):
        return [slice(start, start + self.group_size) for start in range(0, n, self.group_size)]

    def forward(self, x, gamma, beta):
        self.groups = [BatchNorm(*self.batch_norm_args) for _ in self._parts(len(x))]
        y = get_array_module(x).empty_like(x)
        for group, part in zip(self.groups, self._parts(len(x))):
            y[part] = group.forward(x[part], gamma, beta)
        return y

    def backward(self, gy):
        gx, ggamma, gbeta = get_array_module(gy).empty_like(gy), 0, 0
        for group, part in zip(self.groups, self._parts(len(gy))):
            gx[part], group_ggamma, group_gbeta = group.backward(gy[part])
            ggamma, gbeta = ggamma + group_ggamma, gbeta + group_gbeta
        return gx, ggamma, gbeta


def batch_norm(x, gamma, beta, running_mean, running_var, training=True, momentum=0.1, eps=1e-5,
               group_size=None):
    """Batch norm of NHWC `x` with per-channel `gamma`, `beta`; running stats (arrays or None)
    are updated in place when training. With `group_size` (training only), statistics over
    groups of that many images, which must divide the batch."""
    args = running_mean, running_var, training, momentum, eps
    n = getattr(x, "shape", (0,))[0]
    if not training or not group_size or group_size >= n:
        return BatchNorm(*args)(x, gamma, beta)
    if n % group_size:
        raise ValueError(f"a batch of {n} images does not split into BN groups of {group_size}")
    return GhostBatchNorm(group_size, *args)(x, gamma, beta)
