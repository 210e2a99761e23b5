"""Launcher of kernels/batchnorm.cu: batch norm, plain and fused with ReLU / add+ReLU.

Every pass is per channel over the N·H·W rows, on one grid: blocks of CHANNELS channels ×
ROW_LANES row lanes, blockIdx.y a slab of rows; the finalize kernels take CHANNELS channels ×
FINALIZE_LANES slab lanes. Data is float32 or bf16 (BF16 bits); γ, β and the statistics float32.
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
DEFINES = {"BN_CHANNELS": CHANNELS, "BN_ROW_LANES": ROW_LANES, "FINALIZE_LANES": FINALIZE_LANES}
BLOCK, FINALIZE_BLOCK = (CHANNELS, ROW_LANES), (CHANNELS, FINALIZE_LANES)
NAMES = tuple(f"{k}<{cxx_type(t)}>" for k in ("bn_stats", "bn_apply", "bn_backward_reduce", "bn_backward_apply")
              for t in (numpy.float32, BF16)) + ("bn_finalize", "bn_backward_finalize")


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
        """y = act(BN(x) [+ residual]) and what the backward pass needs, (mean, inv_std, scale).
        Training normalizes with batch statistics and updates running_mean/var in place when
        they are given; eval uses them."""
        xp = get_array_module(x)
        channels = x.shape[-1]
        rows = x.size // channels
        t = cxx_type(x.dtype)
        grid, per_slab = self._bn_grid(rows, channels)
        mean, inv_std, scale, shift = (xp.empty(channels, dtype=numpy.float32) for _ in range(4))
        if training:
            partial = xp.empty((grid[1], 3, channels), dtype=numpy.float32)
            self.launch(FAMILY, f"bn_stats<{t}>", grid, BLOCK, (x, *i32(rows, channels, per_slab), partial))
            stats = (partial, numpy.int32(grid[1]))
        else:
            stats = (NULL, numpy.int32(0))
        self.launch(FAMILY, "bn_finalize", grid[:1], FINALIZE_BLOCK,
                    (*stats, *i32(channels, rows), gamma, beta, numpy.float32(eps), numpy.float32(momentum),
                     pointer(running_mean), pointer(running_var), mean, inv_std, scale, shift))
        y = xp.empty_like(x)
        self.launch(FAMILY, f"bn_apply<{t}>", grid, BLOCK,
                    (x, pointer(residual), scale, shift, y, *i32(rows, channels, per_slab, bool(relu))))
        return y, (mean, inv_std, scale)

    def batch_norm_backward(self, gy, x, saved, training, y=None, residual_grad=False):
        """(dx, dγ, dβ, d_residual or None). `saved` is batch_norm_forward's; `y` its output when
        the forward fused a ReLU (the mask), and residual_grad asks for the residual's gradient."""
        xp = get_array_module(gy)
        mean, inv_std, scale = saved
        channels = x.shape[-1]
        rows = x.size // channels
        t = cxx_type(x.dtype)
        grid, per_slab = self._bn_grid(rows, channels)
        partial = xp.empty((grid[1], 2, channels), dtype=numpy.float32)
        self.launch(FAMILY, f"bn_backward_reduce<{t}>", grid, BLOCK,
                    (gy, x, pointer(y), mean, *i32(rows, channels, per_slab), partial))
        ggamma, gbeta, k1, k0 = (xp.empty(channels, dtype=numpy.float32) for _ in range(4))
        self.launch(FAMILY, "bn_backward_finalize", grid[:1], FINALIZE_BLOCK,
                    (partial, *i32(grid[1], channels, rows), inv_std, scale, numpy.int32(bool(training)),
                     ggamma, gbeta, k1, k0))
        gx = xp.empty_like(x)
        gresidual = xp.empty_like(x) if residual_grad else None
        self.launch(FAMILY, f"bn_backward_apply<{t}>", grid, BLOCK,
                    (gy, x, pointer(y), mean, scale, k1, k0, gx, pointer(gresidual), *i32(rows, channels, per_slab)))
        return gx, ggamma, gbeta, gresidual
