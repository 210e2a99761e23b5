"""Batch normalization over N·H·W of an NHWC tensor, torch's conventions.

Training normalizes with the batch statistics and updates the running ones in place (the
running variance from the UNBIASED batch variance); evaluation uses the running statistics.
Both reduce to y = x·scale + shift per channel, so x̂ is never materialized; backward folds
into dx = gy·scale + x·c1 + c0, needing only Σ gy and Σ gy·x. Every pass runs over chunks of
the (N·H·W, C) matrix in parallel, and the chunks' moments are merged in chunk order.

Details: docs/ops.md, "minidl/ops/norm.py".
"""
import functools

from minidl import workspace
from minidl.autograd import Function
from minidl.backend import get_array_module
from minidl.ops.dispatch import Op
from minidl.parallel import WIDE_ROW, map_rows, sum_rows


def widened(a2):
    """The (M, C) matrix a2 as an (M/r, r·C) view, r ≤ WIDE_ROW / C dividing M; and r."""
    rows, channels = a2.shape
    r = max(1, WIDE_ROW // channels)
    while rows % r:
        r -= 1
    return a2.reshape(rows // r, r * channels), r


def column_sums(a):
    """Σ over rows of a (rows, C) matrix, as a BLAS product (faster than sum(axis=0) for small C)."""
    return get_array_module(a).ones(a.shape[0], dtype=a.dtype) @ a


def fold(sums, channels):
    """Per-channel totals of sums over the r·C columns of a widened matrix."""
    return sums.reshape(-1, channels).sum(axis=0)


def moments(rows, channels):
    """(count, mean, Σ (x − mean)²) per channel of one chunk of a widened matrix."""
    xp = get_array_module(rows)
    r = rows.shape[1] // channels
    count = rows.shape[0] * r
    mean = fold(column_sums(rows), channels) / count
    centered = workspace.scratch("batch_norm", rows.shape, rows)
    xp.subtract(rows, xp.tile(mean, r), out=centered)
    centered *= centered
    return count, mean, fold(column_sums(centered), channels)


def merge_moments(a, b):
    """The moments of two chunks together (Chan, Golub and LeVeque's pairwise update)."""
    (count_a, mean_a, m2_a), (count_b, mean_b, m2_b) = a, b
    count = count_a + count_b
    delta = mean_b - mean_a
    return count, mean_a + delta * (count_b / count), m2_a + m2_b + delta * delta * (count_a * count_b / count)


def mean_and_variance(x2):
    """Per-channel mean and biased variance of the (M, C) matrix x2, in one parallel pass."""
    channels = x2.shape[1]
    parts = map_rows(lambda rows: moments(rows, channels), widened(x2)[0])
    count, mean, m2 = functools.reduce(merge_moments, parts)
    return mean, m2 / count


def affine(x2, scale, shift=None):
    """x·scale (+ shift) per channel, written into a new array chunk by chunk."""
    xp = get_array_module(x2)
    xw, r = widened(x2)
    scale = xp.tile(scale, r)
    shift = None if shift is None else xp.tile(shift, r)
    y = xp.empty_like(xw)

    def chunk(x_rows, y_rows):
        xp.multiply(x_rows, scale, out=y_rows)
        if shift is not None:
            y_rows += shift

    map_rows(chunk, xw, y)
    return y.reshape(x2.shape)


class BatchNorm(Op):
    def __init__(self, running_mean, running_var, training, momentum, eps):
        self.running_mean, self.running_var = running_mean, running_var
        self.training, self.momentum, self.eps = training, momentum, eps

    def state_arrays(self):
        return self.running_mean, self.running_var

    def forward_kernels(self, kernels, x, gamma, beta):
        self.x = x
        y, self.saved = kernels.batch_norm_forward(x, gamma, beta, self.running_mean, self.running_var, self.training,
                                                   self.momentum, self.eps)
        return y

    def backward_kernels(self, kernels, gy):
        return kernels.batch_norm_backward(gy, self.x, self.saved, self.training)[:3]

    def forward_reference(self, x, gamma, beta):
        x2 = x.reshape(-1, x.shape[-1])
        if self.training:
            mean, var = mean_and_variance(x2)
            update_running(self.running_mean, self.running_var, self.momentum, mean, var, x2.shape[0])
        else:
            mean, var = self.running_mean, self.running_var
        inv_std, scale, shift = normalization(mean, var, gamma, beta, self.eps)
        self.x, self.mean, self.inv_std, self.scale = x, mean, inv_std, scale
        return affine(x2, scale, shift).reshape(x.shape)

    def backward_reference(self, gy):
        xp = get_array_module(gy)
        channels = gy.shape[-1]
        gy2, x2 = gy.reshape(-1, channels), self.x.reshape(-1, channels)
        (gyw, r), xw = widened(gy2), widened(x2)[0]
        gbeta, gy_dot_x = (fold(sums, channels) for sums in sum_rows(gradient_sums, gyw, xw))
        ggamma, c1, c0 = gradient_coefficients(gbeta, gy_dot_x, self.mean, self.inv_std, self.scale, gy2.shape[0],
                                               self.training)
        if c1 is None:
            return affine(gy2, self.scale).reshape(gy.shape), ggamma, gbeta
        scale, c1, c0 = (xp.tile(v, r) for v in (self.scale, c1, c0))
        gx = xp.empty_like(gyw)
        map_rows(lambda g, x, out: input_gradient(g, x, scale, c1, c0, out), gyw, xw, gx)
        return gx.reshape(gy.shape), ggamma, gbeta


def update_running(running_mean, running_var, momentum, mean, var, count):
    """running ← (1 − momentum)·running + momentum·batch, in place (nothing where running_mean
    is None); the variance from the unbiased batch variance of `count` values."""
    if running_mean is None:
        return
    unbiased_var = var * (count / max(count - 1, 1))
    running_mean *= 1 - momentum
    running_mean += momentum * mean
    running_var *= 1 - momentum
    running_var += momentum * unbiased_var


def normalization(mean, var, gamma, beta, eps):
    """(inv_std, scale, shift) per channel: BN(x) = x·scale + shift."""
    inv_std = 1.0 / get_array_module(var).sqrt(var + eps)
    scale = gamma * inv_std
    return inv_std, scale, beta - mean * scale


def gradient_coefficients(gbeta, gy_dot_x, mean, inv_std, scale, count, training):
    """(dγ, c1, c0) from dβ = Σ gy and Σ gy·x over `count` values, for dx = gy·scale + x·c1 + c0;
    c1 and c0 are None in evaluation, where the statistics are constants and dx = gy·scale."""
    # dγ = Σ gy·x̂ = inv_std·(Σ gy·x − mean·Σ gy)
    ggamma = inv_std * (gy_dot_x - mean * gbeta)
    if not training:
        return ggamma, None, None
    # dx = scale·(gy − dβ/M − x̂·dγ/M), with x̂ = (x − mean)·inv_std, regrouped
    c1 = -scale * inv_std * ggamma / count
    return ggamma, c1, -scale * gbeta / count - c1 * mean


def input_gradient(g, x, scale, c1, c0, out):
    """out = g·scale + x·c1 + c0 over one chunk of rows (out may be g itself)."""
    xp = get_array_module(g)
    x_c1 = workspace.scratch("batch_norm", x.shape, x)
    xp.multiply(g, scale, out=out)
    xp.multiply(x, c1, out=x_c1)
    out += x_c1
    out += c0


def gradient_sums(g, x):
    """(Σ g, Σ g·x) over the rows of one chunk, per column."""
    g_x = workspace.scratch("batch_norm", g.shape, g)
    get_array_module(g).multiply(g, x, out=g_x)
    return get_array_module(g).stack([column_sums(g), column_sums(g_x)])


def group_images(n, training, group_size):
    """Images per statistics group of a batch of n (evaluation: one group, the batch)."""
    first = statistics_groups(n, training, group_size)[0]
    return first.stop - first.start


def statistics_groups(n, training, group_size):
    """The image ranges of a batch of n that BN takes statistics over: the whole batch, or in
    training consecutive groups of `group_size` images, which must divide it."""
    if not training or not group_size or group_size >= n:
        return [slice(0, n)]
    if n % group_size:
        raise ValueError(f"a batch of {n} images does not split into BN groups of {group_size}")
    return [slice(start, start + group_size) for start in range(0, n, group_size)]


class GhostBatchNorm(Function):
    """Batch norm with statistics over groups of `group_size` consecutive images ("ghost" batch
    norm; Goyal et al. normalize over 32 images per worker whatever the batch): each group is
    normalized as a batch of its own, and updates the running statistics in turn."""

    def __init__(self, group_size, *batch_norm_args):
        self.group_size, self.batch_norm_args = group_size, batch_norm_args

    def forward(self, x, gamma, beta):
        self.parts = statistics_groups(len(x), True, self.group_size)
        self.groups = [BatchNorm(*self.batch_norm_args) for _ in self.parts]
        y = get_array_module(x).empty_like(x)
        for group, part in zip(self.groups, self.parts):
            y[part] = group.forward(x[part], gamma, beta)
        return y

    def backward(self, gy):
        gx, ggamma, gbeta = get_array_module(gy).empty_like(gy), 0, 0
        for group, part in zip(self.groups, self.parts):
            gx[part], group_ggamma, group_gbeta = group.backward(gy[part])
            ggamma, gbeta = ggamma + group_ggamma, gbeta + group_gbeta
        return gx, ggamma, gbeta


def batch_norm(x, gamma, beta, running_mean, running_var, training=True, momentum=0.1, eps=1e-5,
               group_size=None):
    """Batch norm of NHWC `x` with per-channel `gamma`, `beta`; running stats (arrays or None)
    are updated in place when training. With `group_size` (training only), statistics over
    groups of that many images, which must divide the batch."""
    args = running_mean, running_var, training, momentum, eps
    if len(statistics_groups(len(x), training, group_size)) == 1:
        return BatchNorm(*args)(x, gamma, beta)
    return GhostBatchNorm(group_size, *args)(x, gamma, beta)
