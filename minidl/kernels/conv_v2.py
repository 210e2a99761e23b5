"""Launcher of kernels/conv_v2.cu: the convolution passes on mma.sync, ldmatrix, swizzled shared
memory and a cp.async pipeline (the opening comment of the .cu explains them).

A `V2Tile` is written once, here, and reaches conv_v2.cu as template arguments; `launch` runs
one pass with a given split of the reduction, optionally with batch-norm work (a `Fusion`).
Which tile and split a shape gets is decided in minidl.kernels.conv.

Details: docs/kernels.md, "minidl/kernels/conv_v2.py".
"""
from typing import NamedTuple

import numpy

from minidl.backend import BF16, get_array_module
from minidl.intmath import ceil_div
from minidl.kernels.batchnorm import NORM_DEFINES
from minidl.kernels.launch import NULL, cxx_type, i32, pointer

FAMILY = "conv_v2"
SPLITK_THREADS = 256
SPLIT_SUMS = tuple(f"splitk_reduce<{cxx_type(t)}>" for t in (numpy.float32, BF16))  # in v2's and v3's modules
NORM_TABLE_BYTES = 16384  # a normalizing pass's scale and shift in shared memory, after its stages
DEFINES = {"SPLITK_THREADS": SPLITK_THREADS, "NORM_TABLE_BYTES": NORM_TABLE_BYTES, **NORM_DEFINES}
PASSES = ("conv_fwd", "conv_dgrad", "conv_wgrad")
MAX_SPLITS = 64
NORMALIZE, STATS, DRELU = 1, 2, 4  # conv_v2_norm.cuh's FUSE bits
FUSIONS = {"conv_fwd": (0, NORMALIZE, STATS, NORMALIZE | STATS), "conv_dgrad": (0, DRELU), "conv_wgrad": (0, NORMALIZE)}
SUM_FIELDS = {STATS: 3, DRELU: 2}  # count, mean, M2; Σg, Σg(y − mean)


class Fusion(NamedTuple):
    """The batch-norm work of one convolution pass: `bits` (NORMALIZE: read relu(x·scale + shift)
    for x; STATS: the output's moments; DRELU: grad-input masked by relu(bn(y))'s derivative, with
    the backward sums), `norm` the input's (groups, NORM_ROWS, C) batch norm, `bn_input` y for
    DRELU, `group_images` images per statistics group."""
    bits: int
    norm: object = None
    bn_input: object = None
    group_images: int = 0

    @property
    def whole_reduction(self):
        """Whether the epilogue needs the whole product in one block (no split-K)."""
        return bool(self.bits & (STATS | DRELU))

    def label(self):
        return "+".join(name for bit, name in ((NORMALIZE, "normalize"), (STATS, "stats"), (DRELU, "drelu"))
                        if self.bits & bit)


def kernel_kind(conv_pass, fusion_bits=0):
    """The kind of kernel a pass with this fusion runs, as the tuner keeps its statuses: the
    canary's validation and the tuner's lookups must name a kernel alike."""
    return conv_pass + (f"+{Fusion(fusion_bits).label()}" if fusion_bits else "")


class V2Tile:
    """One V2Tile of conv_v2.cu: data type, the block's BM×BN tile, BK reduction elements per
    stage, warp tiles of WM×WN, `stages` stages in flight."""

    def __init__(self, name, dtype, bm, bn, bk, wm, wn, stages):
        self.name, self.dtype = name, numpy.dtype(dtype)
        self.bm, self.bn, self.bk, self.wm, self.wn, self.stages = bm, bn, bk, wm, wn, stages
        self.threads = 32 * (bm // wm) * (bn // wn)
        self.chunk = 16 // self.dtype.itemsize  # elements per 16-byte copy
        self.pipeline_bytes = stages * (bm + bn) * bk * self.dtype.itemsize
        self.smem_bytes = max(self.pipeline_bytes, bm * (bn * 4 + 16))  # the stages, or the fp32 epilogue tile

    @property
    def template(self):
        return (f"V2Tile<{cxx_type(self.dtype)}, {self.bm}, {self.bn}, {self.bk}, {self.wm}, {self.wn}, "
                f"{self.stages}, {self.smem_bytes}>")

    def kernel(self, conv_pass, fuse=0):
        return f"{conv_pass}_v2<{self.template}, {fuse}>"

    def serves(self, conv_pass):
        return self.dtype == BF16 or conv_pass != "conv_wgrad"

    def fits(self, conv_pass, dtype, geometry):
        """Whether this tile computes `conv_pass` of this data type and geometry."""
        c, k = geometry[3], geometry[4]
        if not self.serves(conv_pass) or numpy.dtype(dtype) != self.dtype or c % self.chunk or k % self.chunk:
            return False
        return {"conv_fwd": c % self.bk == 0, "conv_dgrad": k % self.bk == 0, "conv_wgrad": True}[conv_pass]

    def fits_fusion(self, conv_pass, fusion, geometry):
        """Whether the normalizing pass's table (forward: [scale | shift][C] of its group;
        grad-weight: every group's for the block's columns) fits NORM_TABLE_BYTES."""
        if not fusion.bits & NORMALIZE:
            return True
        n, c = geometry[0], geometry[3]
        entries = 2 * c if conv_pass == "conv_fwd" else 2 * (n // fusion.group_images) * self.bn
        return entries * self.dtype.itemsize <= NORM_TABLE_BYTES

    def shared_bytes(self, fusion):
        """The dynamic shared memory of a launch: the tile's, and a normalizing pass's table."""
        if fusion.bits & NORMALIZE:
            return max(self.smem_bytes, self.pipeline_bytes + NORM_TABLE_BYTES)
        return self.smem_bytes

    def group_tiles(self, conv_pass, geometry, group_images):
        """Blocks along M per statistics group of `group_images` images (forward and grad-input
        lay their blocks out by group; grad-input by the group's share of its largest phase)."""
        _, h, w, _, _, _, _, p, q, stride, _ = geometry
        image_rows = p * q if conv_pass == "conv_fwd" else ceil_div(h, stride) * ceil_div(w, stride)
        return ceil_div(group_images * image_rows, self.bm)

    def grid(self, conv_pass, geometry, splits, group_images=None):
        n, _, _, c, k, r, s, _, _, stride, _ = geometry
        if conv_pass == "conv_wgrad":
            return ceil_div(k, self.bm), ceil_div(r * s * c, self.bn), splits
        images = group_images or n
        blocks = n // images * self.group_tiles(conv_pass, geometry, images)
        if conv_pass == "conv_fwd":
            return blocks, ceil_div(k, self.bn), splits
        return blocks, ceil_div(c, self.bn), stride * stride * splits

    def k_tiles(self, conv_pass, geometry):
        """Reduction tiles of the pass (for grad-input, of its largest phase: stride 1's all)."""
        n, _, _, c, k, r, s, p, q = geometry[:9]
        if conv_pass == "conv_wgrad":
            return ceil_div(n * p * q, self.bk)
        return (r * s * c if conv_pass == "conv_fwd" else r * s * k) // self.bk


# TF32 grad-weight stays on v1: both its operands have the reduction (the pixels) strided, and
# ldmatrix cannot transpose 32-bit elements, so every fragment register would take an LDS of its
# own (one per mma before any copy) — the v1 WMMA kernel remains its only kernel.
TILES = {t.name: t for t in (
    V2Tile("bf16_128x256", BF16, 128, 256, 64, 64, 64, 4),
    V2Tile("bf16_256x128", BF16, 256, 128, 64, 64, 64, 4),
    V2Tile("bf16_128x128", BF16, 128, 128, 64, 64, 64, 3),  # 96 KiB: two blocks per SM
    V2Tile("tf32_128x256", numpy.float32, 128, 256, 32, 64, 64, 3),
)}
NAMES = tuple(tile.kernel(p, fuse) for p in PASSES for tile in TILES.values() if tile.serves(p)
              for fuse in FUSIONS[p]) + SPLIT_SUMS


def launch(launcher, conv_pass, tile, splits, geometry, a, b, out, fusion=None):
    """Run `conv_pass` with `tile` and `splits` on the operands a, b (fwd: x, w; dgrad: dy, w;
    wgrad: x, dy) into `out` (fwd: y; dgrad: dx; wgrad: dW, float32), with the batch-norm work of
    `fusion` (a Fusion, or None). Returns the fused epilogue's sums, or None."""
    xp = get_array_module(out)
    n, channels = geometry[0], (geometry[4] if conv_pass == "conv_fwd" else geometry[3])
    fusion = fusion or Fusion(0)
    if splits > 1 and fusion.whole_reduction:
        raise ValueError(f"{fusion.label()} needs the whole reduction in one block, not {splits} splits")
    images = fusion.group_images or n
    grid = tile.grid(conv_pass, geometry, splits, images)
    sums = None
    if fusion.bits & (STATS | DRELU):
        fields = SUM_FIELDS[fusion.bits & (STATS | DRELU)]
        sums = xp.empty((n // images, grid[0] * grid[2] // (n // images), fields, channels), dtype=numpy.float32)
    split_out = splits > 1 and conv_pass != "conv_wgrad"
    partial = xp.empty((splits, *out.shape), dtype=numpy.float32) if splits > 1 else None
    if conv_pass == "conv_wgrad":
        arguments = (a, b, partial if partial is not None else out)
    else:
        arguments = (a, b, out, partial if split_out else NULL)
    group_tiles = tile.group_tiles(conv_pass, geometry, images) if conv_pass != "conv_wgrad" else 1
    norm_arguments = (pointer(fusion.norm), pointer(fusion.bn_input), pointer(sums), *i32(images, group_tiles))
    launcher.launch(FAMILY, tile.kernel(conv_pass, fusion.bits), grid, (tile.threads,),
                    (*arguments, *i32(*geometry), *norm_arguments), shared_mem=tile.shared_bytes(fusion))
    if partial is not None:
        sum_splits(launcher, FAMILY, partial, out)
    return sums


def sum_splits(launcher, family, partial, out):
    """out = the sum over the first axis of `partial`, in order: splitk_reduce (kernels/splitk_reduce.cuh)
    of `family`'s module."""
    launcher.launch(family, f"splitk_reduce<{cxx_type(out.dtype)}>", launcher.elementwise_grid(out.size, SPLITK_THREADS),
                    (SPLITK_THREADS,), (partial, out, numpy.int64(out.size), numpy.int32(len(partial))))
