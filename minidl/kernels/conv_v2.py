"""Launcher of kernels/conv_v2.cu: the convolution passes on mma.sync, ldmatrix, swizzled shared
memory and a cp.async pipeline (the opening comment of the .cu explains them).

A `V2Tile` is written once, here: its sizes reach conv_v2.cu as the template arguments of the
kernel names, with the dynamic shared memory the launch gives (checked there at compile
time). `fits` says which passes and shapes a tile serves; `launch` runs one pass with a given
split of the reduction (split-K writes fp32 partial results that splitk_reduce_v2 sums in a
fixed order). Which tile and split a shape gets is decided in minidl.kernels.conv (the
autotuner, or the fixed choice).
"""
import numpy

from minidl.backend import BF16, get_array_module
from minidl.intmath import ceil_div
from minidl.kernels.launch import NULL, cxx_type, i32

FAMILY = "conv_v2"
SPLITK_THREADS = 256
DEFINES = {"SPLITK_V2_THREADS": SPLITK_THREADS}
PASSES = ("conv_fwd", "conv_dgrad", "conv_wgrad")
MAX_SPLITS = 64


class V2Tile:
    """One V2Tile of conv_v2.cu: data type, the block's BM×BN tile, BK reduction elements per
    stage, warp tiles of WM×WN, `stages` stages in flight."""

    def __init__(self, name, dtype, bm, bn, bk, wm, wn, stages):
        self.name, self.dtype = name, numpy.dtype(dtype)
        self.bm, self.bn, self.bk, self.wm, self.wn, self.stages = bm, bn, bk, wm, wn, stages
        self.threads = 32 * (bm // wm) * (bn // wn)
        self.chunk = 16 // self.dtype.itemsize  # elements per 16-byte copy
        pipeline = stages * (bm + bn) * bk * self.dtype.itemsize
        self.smem_bytes = max(pipeline, bm * (bn * 4 + 16))  # the stages, or the fp32 epilogue tile

    @property
    def template(self):
        return (f"V2Tile<{cxx_type(self.dtype)}, {self.bm}, {self.bn}, {self.bk}, {self.wm}, {self.wn}, "
                f"{self.stages}, {self.smem_bytes}>")

    def kernel(self, conv_pass):
        return f"{conv_pass}_v2<{self.template}>"

    def serves(self, conv_pass):
        return self.dtype == BF16 or conv_pass != "conv_wgrad"

    def fits(self, conv_pass, dtype, geometry):
        """Whether this tile computes `conv_pass` of this data type and geometry."""
        c, k = geometry[3], geometry[4]
        if not self.serves(conv_pass) or numpy.dtype(dtype) != self.dtype or c % self.chunk or k % self.chunk:
            return False
        return {"conv_fwd": c % self.bk == 0, "conv_dgrad": k % self.bk == 0, "conv_wgrad": True}[conv_pass]

    def grid(self, conv_pass, geometry, splits):
        n, h, w, c, k, r, s, p, q, stride, _ = geometry
        if conv_pass == "conv_fwd":
            return ceil_div(n * p * q, self.bm), ceil_div(k, self.bn), splits
        if conv_pass == "conv_dgrad":
            largest_phase = n * ceil_div(h, stride) * ceil_div(w, stride)
            return ceil_div(largest_phase, self.bm), ceil_div(c, self.bn), stride * stride * splits
        return ceil_div(k, self.bm), ceil_div(r * s * c, self.bn), splits

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
NAMES = tuple(tile.kernel(p) for p in PASSES for tile in TILES.values() if tile.serves(p)) + tuple(
    f"splitk_reduce_v2<{cxx_type(t)}>" for t in (numpy.float32, BF16))


def launch(launcher, conv_pass, tile, splits, geometry, a, b, out):
    """Run `conv_pass` with `tile` and `splits` on the operands a, b (fwd: x, w; dgrad: dy, w;
    wgrad: x, dy) into `out` (fwd: y; dgrad: dx; wgrad: dW, float32)."""
    xp = get_array_module(out)
    split_out = splits > 1 and conv_pass != "conv_wgrad"
    partial = xp.empty((splits, *out.shape), dtype=numpy.float32) if splits > 1 else None
    if conv_pass == "conv_wgrad":
        arguments = (a, b, partial if partial is not None else out)
    else:
        arguments = (a, b, out, partial if split_out else NULL)
    launcher.launch(FAMILY, tile.kernel(conv_pass), tile.grid(conv_pass, geometry, splits), (tile.threads,),
                    (*arguments, *i32(*geometry)), shared_mem=tile.smem_bytes)
    if partial is not None:
        launcher.launch(FAMILY, f"splitk_reduce_v2<{cxx_type(out.dtype)}>",
                        launcher.elementwise_grid(out.size, SPLITK_THREADS), (SPLITK_THREADS,),
                        (partial, out, numpy.int64(out.size), numpy.int32(splits)))
    return out
