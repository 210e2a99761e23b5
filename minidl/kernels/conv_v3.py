"""Launcher of kernels/conv_v3.cu: the bf16 convolution passes on Hopper's warpgroup MMA (wgmma),
a producer warpgroup filling shared-memory stages with cp.async and consumer warpgroups
multiplying them, synchronized by mbarriers (the opening comment of the .cu explains them).
Built for sm_90a only (`ARCH`: another GPU records every v3 plan unavailable, never runs one).
A `V3Tile` is written once, here, and reaches conv_v3.cu as template arguments; `launch` runs one
pass with a given split of the reduction, splitk_reduce (kernels/splitk_reduce.cuh) summing the splits. No
TF32 (wgmma reads 32-bit operands K-major only, grad-weight's are MN-major), no fused batch norm.

Details: docs/kernels.md, "Convolution kernels v3 (wgmma, sm_90a)".
"""
import numpy

from minidl.backend import BF16, get_array_module
from minidl.intmath import ceil_div
from minidl.kernels import conv_v2
from minidl.kernels.launch import NULL, i32
from minidl.kernels.loader import SM_90A

FAMILY = "conv_v3"
ARCH = SM_90A  # wgmma and setmaxnreg
DEFINES = {"SPLITK_THREADS": conv_v2.SPLITK_THREADS}
PASSES = conv_v2.PASSES
FUSIONS = {conv_pass: (0,) for conv_pass in PASSES}  # the plain passes only: no batch-norm fusion here
BK = 64  # reduction elements per stage: one 128-byte swizzled row
MAX_SPLITS = conv_v2.MAX_SPLITS


class V3Tile:
    """One V3Tile of conv_v3.cu: a BM×BN tile (BM = 64 per consumer warpgroup), `stages` stages
    in flight, the registers per thread of the producer and of the consumers after setmaxnreg."""
    dtype = numpy.dtype(BF16)

    def __init__(self, name, bn, consumers, stages, producer_regs, consumer_regs):
        self.name, self.bn, self.consumers, self.stages = name, bn, consumers, stages
        self.bm, self.bk = 64 * consumers, BK
        self.producer_regs, self.consumer_regs = producer_regs, consumer_regs
        self.threads = 128 * (1 + consumers)
        self.pipeline_bytes = stages * (self.bm + bn) * BK * self.dtype.itemsize
        self.smem_bytes = self.pipeline_bytes + 2 * stages * 8  # the stages and their mbarriers

    @property
    def template(self):
        return (f"V3Tile<{self.bn}, {self.consumers}, {self.stages}, {self.producer_regs}, {self.consumer_regs}, "
                f"{self.smem_bytes}>")

    def kernel(self, conv_pass):
        return f"{conv_pass}_v3<{self.template}>"

    def serves(self, conv_pass):
        """Grad-weight's producer holds a window offset and mask per chunk of B: 32 registers at
        BN = 256, past its budget (ptxas spills), so only the 128-wide tile serves it."""
        return conv_pass != "conv_wgrad" or self.bn <= 128

    def fits(self, conv_pass, dtype, geometry):
        """Whether this tile computes `conv_pass` of this data type and geometry."""
        c, k = geometry[3], geometry[4]
        if not self.serves(conv_pass) or numpy.dtype(dtype) != self.dtype or c % 8 or k % 8:
            return False
        return {"conv_fwd": c % BK == 0, "conv_dgrad": k % BK == 0, "conv_wgrad": True}[conv_pass]

    @staticmethod
    def fits_fusion(conv_pass, fusion, geometry):
        """Whether a pass with this batch-norm work (a conv_v2.Fusion) has a v3 kernel: none but the plain one."""
        return fusion.bits in FUSIONS[conv_pass]

    def grid(self, conv_pass, geometry, splits):
        n, h, w, c, k, r, s, p, q, stride, _ = geometry
        if conv_pass == "conv_wgrad":
            return ceil_div(k, self.bm), ceil_div(r * s * c, self.bn), splits
        if conv_pass == "conv_fwd":
            return ceil_div(n * p * q, self.bm), ceil_div(k, self.bn), splits
        largest_phase = n * ceil_div(h, stride) * ceil_div(w, stride)
        return ceil_div(largest_phase, self.bm), ceil_div(c, self.bn), stride * stride * splits

    def k_tiles(self, conv_pass, geometry):
        """Reduction tiles of the pass (for grad-input, of its largest phase: stride 1's all)."""
        n, _, _, c, k, r, s, p, q = geometry[:9]
        if conv_pass == "conv_wgrad":
            return ceil_div(n * p * q, BK)
        return (r * s * c if conv_pass == "conv_fwd" else r * s * k) // BK


# 48 registers for the producer's copy offsets (grad-weight's 128-wide tile spills in 40), 224 for
# a consumer's BN/2 accumulators and descriptors
TILES = {t.name: t for t in (
    V3Tile("bf16_128x128", 128, 2, 4, 48, 224),  # 129 KiB
    V3Tile("bf16_128x256", 256, 2, 4, 48, 224),  # 193 KiB
)}
NAMES = tuple(tile.kernel(p) for p in PASSES for tile in TILES.values() if tile.serves(p)) + conv_v2.SPLIT_SUMS


def launch(launcher, conv_pass, tile, splits, geometry, a, b, out):
    """Run `conv_pass` with `tile` and `splits` on the operands a, b (fwd: x, w; dgrad: dy, w;
    wgrad: x, dy) into `out` (fwd: y; dgrad: dx; wgrad: dW, float32)."""
    xp = get_array_module(out)
    grid = tile.grid(conv_pass, geometry, splits)
    partial = xp.empty((splits, *out.shape), dtype=numpy.float32) if splits > 1 else None
    if conv_pass == "conv_wgrad":
        arguments = (a, b, partial if partial is not None else out)
    else:
        arguments = (a, b, out, partial if partial is not None else NULL)
    launcher.launch(FAMILY, tile.kernel(conv_pass), grid, (tile.threads,), (*arguments, *i32(*geometry)),
                    shared_mem=tile.smem_bytes)
    if partial is not None:
        conv_v2.sum_splits(launcher, FAMILY, partial, out)
