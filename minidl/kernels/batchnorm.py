"""Launcher of kernels/batchnorm.cu: batch norm, plain and fused with ReLU / add+ReLU.

Every pass is per channel over the N·H·W rows, on one grid: blocks of CHANNELS channels ×
ROW_LANES row lanes, blockIdx.y a slab of rows; the finalize kernels take CHANNELS channels ×
FINALIZE_LANES slab lanes. Data is float32 or bf16 (BF16 bits); γ, β and the statistics float32.

`batch_norm_forward` / `batch_norm_backward` are the whole batch norm of one statistics group.
The steps they are made of are methods too, for the batch norms fused into the convolutions
(minidl.kernels.normconv), whose slabs of partial sums come from a convolution's epilogue and
whose per-group vectors live in one `norm` array, (groups, NORM_ROWS, C): the rows NORM_FIELDS.
"""
import numpy

from minidl.backend import BF16, get_array_module
from minidl.intmath import ceil_div
from minidl.kernels.launch import NULL, Launcher, cxx_type, i32, pointer

FAMILY = "batchnorm"
CHANNELS = 32  # channels per block: a warp reads one contiguous run of a row
ROW_LANES = 8  # row lanes of a block
FINALIZE_LANES = 32  # slab lanes of a finalize block
MIN_ROWS_PER_SLAB = 64  # below this a slab's fixed cost dominates
NORM_FIELDS = ("scale", "shift", "mean", "inv_std")  # the rows of a norm array, per group
NORM = {field: row for row, field in enumerate(NORM_FIELDS)}
NORM_DEFINES = {"NORM_ROWS": len(NORM_FIELDS), **{f"NORM_{field.upper()}": row for field, row in NORM.items()}}
DEFINES = {"BN_CHANNELS": CHANNELS, "BN_ROW_LANES": ROW_LANES, "FINALIZE_LANES": FINALIZE_LANES, **NORM_DEFINES}
BLOCK, FINALIZE_BLOCK = (CHANNELS, ROW_LANES), (CHANNELS, FINALIZE_LANES)
AFFINE_THREADS = CHANNELS * ROW_LANES  # bn_affine: a thread per channel
NAMES = tuple(f"{k}<{cxx_type(t)}>" for k in ("bn_stats", "bn_apply", "bn_backward_reduce", "bn_backward_apply")
              for t in (numpy.float32, BF16)) + ("bn_finalize", "bn_backward_finalize", "bn_moments", "bn_affine")


def rows_and_channels(x):
    channels = x.shape[-1]
    return x.size // channels, channels


class BatchNormKernels(Launcher):
    def _bn_grid(self, rows, channels):
        """(grid, rows per slab): enough blocks to fill the GPU about 8 times over."""
        channel_blocks = ceil_div(channels, CHANNELS)
        wanted = ceil_div(8 * self.multiprocessors, channel_blocks)
        slabs = max(1, min(wanted, ceil_div(rows, MIN_ROWS_PER_SLAB), 65535))
        per_slab = ceil_div(rows, slabs)
        return (channel_blocks, ceil_div(rows, per_slab)), per_slab

    def batch_norm_forward(self, x, gamma, beta, running_mean, running_var, training, momentum, eps,
                           residual=None, relu=False):
        """y = act(BN(x) [+ residual]) and what the backward pass needs (its norm array, one
        group). Training normalizes with batch statistics and updates running_mean/var in place
        when they are given; eval uses them."""
        rows, channels = rows_and_channels(x)
        norm = get_array_module(x).empty((1, len(NORM_FIELDS), channels), dtype=numpy.float32)
        if training:
            partial = self.batch_norm_partials(x)
            stats = (partial, numpy.int32(len(partial)))
        else:
            stats = (NULL, numpy.int32(0))
        self.launch(FAMILY, "bn_finalize", (ceil_div(channels, CHANNELS),), FINALIZE_BLOCK,
                    (*stats, *i32(channels, rows), gamma, beta, numpy.float32(eps), numpy.float32(momentum),
                     pointer(running_mean), pointer(running_var),
                     *(norm[0, NORM[field]] for field in ("mean", "inv_std", "scale", "shift"))))
        y = self.batch_norm_apply(x, norm[0, NORM["scale"]], norm[0, NORM["shift"]], relu, residual)
        return y, norm

    def batch_norm_backward(self, gy, x, norm, training, y=None, residual_grad=False):
        """(dx, dγ, dβ, d_residual or None). `norm` is what batch_norm_forward returned beside its
        output; `y` that output when the forward fused a ReLU (the mask), and residual_grad asks
        for the residual's gradient."""
        partial = self.batch_norm_backward_partials(gy, x, y, norm[0, NORM["mean"]])
        ggamma, gbeta, k1, k0 = self.batch_norm_backward_coefficients(partial[None], x.size // x.shape[-1], norm,
                                                                      training)
        gx, gresidual = self.batch_norm_backward_apply(gy, x, y, norm[0, NORM["mean"]], norm[0, NORM["scale"]],
                                                       k1[0], k0[0], residual_grad)
        return gx, ggamma, gbeta, gresidual

    # ---- the steps ----------------------------------------------------------------------------
    def batch_norm_partials(self, x, out=None):
        """bn_stats: per slab of rows the Welford (count, mean, M2) of every channel, (slabs, 3, C)."""
        rows, channels = rows_and_channels(x)
        grid, per_slab = self._bn_grid(rows, channels)
        partial = get_array_module(x).empty((grid[1], 3, channels), dtype=numpy.float32) if out is None else out
        self.launch(FAMILY, f"bn_stats<{cxx_type(x.dtype)}>", grid, BLOCK, (x, *i32(rows, channels, per_slab), partial))
        return partial

    def batch_norm_slabs(self, rows, channels):
        """How many slabs batch_norm_partials and batch_norm_backward_partials take for this shape."""
        return self._bn_grid(rows, channels)[0][1]

    def batch_norm_moments(self, sums, rows):
        """(groups, 2, C) float32: each group's mean and biased variance from its slabs of Welford
        partials, `sums` (groups, slabs, 3, C); `rows` per group."""
        groups, slabs, _, channels = sums.shape
        stats = get_array_module(sums).empty((groups, 2, channels), dtype=numpy.float32)
        self.launch(FAMILY, "bn_moments", (ceil_div(channels, CHANNELS), groups), FINALIZE_BLOCK,
                    (sums, *i32(slabs, channels, rows), stats))
        return stats

    def batch_norm_affine(self, stats, gamma, beta, running_mean, running_var, momentum, eps, rows):
        """norm (max(groups, 1), NORM_ROWS, C): per group scale, shift, mean, 1/std from `stats`
        (groups, 2, C), the running statistics updated group after group (when given); zero groups
        (evaluation): one from the running statistics."""
        groups, channels = len(stats), stats.shape[-1]
        norm = get_array_module(gamma).empty((max(groups, 1), len(NORM_FIELDS), channels), dtype=numpy.float32)
        self.launch(FAMILY, "bn_affine", (ceil_div(channels, AFFINE_THREADS),), (AFFINE_THREADS,),
                    (stats if groups else NULL, *i32(groups, channels, rows), gamma, beta, numpy.float32(eps),
                     numpy.float32(momentum), pointer(running_mean), pointer(running_var), norm))
        return norm

    def batch_norm_apply(self, x, scale, shift, relu, residual=None, residual_scale=None, residual_shift=None,
                         out=None):
        """act(x·scale + shift [+ residual [·residual_scale + residual_shift]]) per channel."""
        rows, channels = rows_and_channels(x)
        grid, per_slab = self._bn_grid(rows, channels)
        y = get_array_module(x).empty_like(x) if out is None else out
        self.launch(FAMILY, f"bn_apply<{cxx_type(x.dtype)}>", grid, BLOCK,
                    (x, pointer(residual), pointer(residual_scale), pointer(residual_shift), scale, shift, y,
                     *i32(rows, channels, per_slab, bool(relu))))
        return y

    def batch_norm_backward_partials(self, gy, x, mask, mean, out=None):
        """bn_backward_reduce: per slab Σ g and Σ g·(x − mean), g = gy masked by `mask` > 0 (a
        ReLU's output) when it is given, (slabs, 2, C)."""
        rows, channels = rows_and_channels(x)
        grid, per_slab = self._bn_grid(rows, channels)
        partial = get_array_module(gy).empty((grid[1], 2, channels), dtype=numpy.float32) if out is None else out
        self.launch(FAMILY, f"bn_backward_reduce<{cxx_type(x.dtype)}>", grid, BLOCK,
                    (gy, x, pointer(mask), mean, *i32(rows, channels, per_slab), partial))
        return partial

    def batch_norm_backward_coefficients(self, sums, rows, norm, training):
        """(dγ, dβ, k1, k0) from each group's slabs of backward sums, `sums` (groups, slabs, 2, C),
        and the groups' `norm`: dγ and dβ summed over the groups, k1 and k0 (groups, C)."""
        xp = get_array_module(sums)
        groups, slabs, _, channels = sums.shape
        ggamma, gbeta = (xp.empty(channels, dtype=numpy.float32) for _ in range(2))
        k1, k0 = (xp.empty((groups, channels), dtype=numpy.float32) for _ in range(2))
        self.launch(FAMILY, "bn_backward_finalize", (ceil_div(channels, CHANNELS),), FINALIZE_BLOCK,
                    (sums, *i32(slabs, groups, channels, rows), norm, numpy.int32(bool(training)), ggamma, gbeta,
                     k1, k0))
        return ggamma, gbeta, k1, k0

    def batch_norm_backward_apply(self, gy, x, mask, mean, scale, k1, k0, residual_grad=False, out=None,
                                  residual_out=None):
        """(dx, d_residual or None): dx = g·scale + (x − mean)·k1 + k0, g = gy masked by `mask` > 0
        when given; d_residual = g (into `residual_out` when given)."""
        rows, channels = rows_and_channels(x)
        grid, per_slab = self._bn_grid(rows, channels)
        xp = get_array_module(gy)
        gx = xp.empty_like(x) if out is None else out
        gresidual = residual_out if residual_out is not None else xp.empty_like(x) if residual_grad else None
        self.launch(FAMILY, f"bn_backward_apply<{cxx_type(x.dtype)}>", grid, BLOCK,
                    (gy, x, pointer(mask), mean, scale, k1, k0, gx, pointer(gresidual), *i32(rows, channels, per_slab)))
        return gx, gresidual
