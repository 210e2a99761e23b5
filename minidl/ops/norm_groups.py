"""Batch norm in pieces that ride along other passes over the data (minidl.ops.normconv).

Each piece works on a chunk of whole images while another pass has it in cache; what the chunks
give is merged in image order afterwards, so results depend on the shapes alone, never on the
threads. The arithmetic is minidl.ops.norm's; only the passes it runs in differ. `Moments`
gathers a convolution's output statistics, `GroupNorm` is one batch norm over their groups.

Details: docs/ops.md, "minidl/ops/norm_groups.py".
"""
import functools

from minidl.backend import get_array_module
from minidl.ops import norm
from minidl.ops.conv import loaded
from minidl.parallel import map_rows, run_chunks, sum_in_order


def overlaps(groups, first, count):
    """(group index, start, stop) for each group that images first .. first + count − 1 reach,
    start and stop relative to `first`."""
    for index, part in enumerate(groups):
        start, stop = max(part.start, first), min(part.stop, first + count)
        if start < stop:
            yield index, start - first, stop - first


def flat_rows(block):
    """A contiguous NHWC block as the 2-D matrix of its image rows, (images·H, W·C)."""
    return block.reshape(-1, block.shape[2] * block.shape[3])


def in_image_order(recorded, index):
    """The parts recorded for group `index`, in the order of their chunks' first images."""
    return [part for first in sorted(recorded) for group, part in recorded[first] if group == index]


class Moments:
    """Per statistics group moments of an NHWC output of n images, gathered chunk by chunk
    (called as a convolution's store) and merged in image order by `statistics`."""

    def __init__(self, n, training, group_size):
        self.groups = norm.statistics_groups(n, training, group_size) if training else []  # none to gather
        self.recorded = {}  # first image of a chunk -> [(group index, moments)]

    def __call__(self, block, first):
        channels = block.shape[-1]
        self.recorded[first] = [
            (index, part) for index, start, stop in overlaps(self.groups, first, len(block))
            for part in map_rows(lambda rows: norm.moments(rows, channels), flat_rows(block[start:stop]))]

    def statistics(self, like):
        """(groups, 2, C): each group's mean and biased variance, in the dtype of `like`."""
        xp = get_array_module(like)
        stats = xp.empty((len(self.groups), 2, like.shape[-1]), dtype=like.dtype)
        for index in range(len(self.groups)):
            count, mean, m2 = functools.reduce(norm.merge_moments, in_image_order(self.recorded, index))
            stats[index, 0], stats[index, 1] = mean, m2 / count
        return stats


class GroupNorm:
    """One batch norm of an NHWC tensor of `shape` over its statistics groups: per group the
    affine map y·scale + shift, from `stats` (Moments.statistics) in training, from the running
    statistics in evaluation."""

    def __init__(self, stats, gamma, beta, running_mean, running_var, training, momentum, eps, group_size, shape):
        xp = get_array_module(gamma)
        n, h, width, _ = shape
        self.training, self.width = training, width
        self.groups = norm.statistics_groups(n, training, group_size)
        self.count = h * width * norm.group_images(n, training, group_size)
        if training:
            if len(stats) != len(self.groups):
                raise ValueError(f"statistics of {len(stats)} groups for a batch norm over {len(self.groups)}")
            batch = [(stats[index, 0], stats[index, 1]) for index in range(len(stats))]
            for mean, var in batch:
                norm.update_running(running_mean, running_var, momentum, mean, var, self.count)
        else:
            batch = [(running_mean, running_var)]
        self.mean, self.inv_std, self.scale, shift = zip(*[(mean, *norm.normalization(mean, var, gamma, beta, eps))
                                                           for mean, var in batch])
        self.scale_rows, self.shift_rows = ([xp.tile(v, width) for v in vectors] for vectors in (self.scale, shift))
        self.zero_row = xp.zeros_like(self.scale_rows[0])
        self.recorded = {}  # backward: first image of a chunk -> [(group index, (Σ g, Σ g·y) per image-row column)]

    def affine(self, src, dst, first):
        """dst = src·scale + shift; src and dst image rows of the images from `first` on."""
        xp = get_array_module(src)
        for index, start, stop in overlaps(self.groups, first, len(src)):
            out = dst[start:stop]
            xp.multiply(src[start:stop], self.scale_rows[index], out=out)
            out += self.shift_rows[index]

    def load(self, src, dst, first):
        """dst = relu(src·scale + shift): the next convolution's input, never stored."""
        self.affine(src, dst, first)
        get_array_module(dst).maximum(dst, self.zero_row, out=dst)

    def record_sums(self, g, y, first, relu_input=None):
        """Record Σ g and Σ g·y per group over a chunk of images (g and y contiguous NHWC blocks of
        the same images, from image `first` on). With `relu_input` — relu(y·scale + shift) of those
        images, or True to recompute it — g is first masked in place where it is not positive."""
        xp = get_array_module(g)
        if relu_input is True:
            relu_input = loaded(y, self.load, first)
        if relu_input is not None:
            xp.multiply(g, relu_input > 0, out=g)
        self.recorded[first] = [
            (index, part) for index, start, stop in overlaps(self.groups, first, len(g))
            for part in map_rows(norm.gradient_sums, flat_rows(g[start:stop]), flat_rows(y[start:stop]))]

    def input_gradient(self, g, y, out):
        """(dγ, dβ) from the recorded sums; writes dL/dy = g·scale + y·c1 + c0 per group into `out`
        (which may be g): g·scale in evaluation."""
        xp = get_array_module(g)
        channels = g.shape[-1]
        coefficients, ggamma, gbeta = [], 0, 0
        for index in range(len(self.groups)):
            group_gbeta, gy_dot_y = (norm.fold(total, channels)
                                     for total in sum_in_order(in_image_order(self.recorded, index)))
            group_ggamma, c1, c0 = norm.gradient_coefficients(group_gbeta, gy_dot_y, self.mean[index],
                                                              self.inv_std[index], self.scale[index], self.count,
                                                              self.training)
            coefficients.append(None if c1 is None else [xp.tile(v, self.width) for v in (c1, c0)])
            ggamma, gbeta = ggamma + group_ggamma, gbeta + group_gbeta

        def chunk(first, stop):
            for index, start, end in overlaps(self.groups, first, stop - first):
                g_rows, y_rows, out_rows = (flat_rows(a[first + start:first + end]) for a in (g, y, out))
                if coefficients[index] is None:
                    xp.multiply(g_rows, self.scale_rows[index], out=out_rows)
                else:
                    norm.input_gradient(g_rows, y_rows, self.scale_rows[index], *coefficients[index], out_rows)

        run_chunks(chunk, len(g), 3 * g[0].nbytes)
        return ggamma, gbeta
