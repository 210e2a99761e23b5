"""Launcher of kernels/conv.cu: implicit-GEMM convolution, forward, grad-input, grad-weight.

Conventions: NHWC activations, KRSC weights, contiguous arrays. float32 data runs on TF32
tensor cores when `allow_tf32` (the default, as in cuDNN; MINIDL_TF32=0 turns it off) and the
channel counts allow, else on the exact fp32 path; bf16 data (BF16 bits, with a bf16 weight)
runs on bf16 tensor cores. Grad-weight comes out float32 for either.

A tile configuration is written once, here (`ConvTile`): its sizes reach conv.cu as the
template arguments of the kernel names, so the grid computed here and the tile the kernel
works on cannot disagree. The dynamic shared memory a tile takes is computed here too and
passed along as the last template argument, which conv.cu checks against its own layout at
compile time.
"""
import numpy

from minidl.backend import BF16, get_array_module
from minidl.intmath import ceil_div
from minidl.kernels.launch import Launcher, data_address, i32

FAMILY = "conv"
THREADS = 256  # every tile's block
BLOCKS_PER_SM = 2  # the register budget: at most 65536 / (THREADS · BLOCKS_PER_SM) per thread
SPLITK_THREADS = 256
MIN_TILES_PER_SPLIT = 8  # wgrad split-K: each split streams at least this many k-tiles
DEFINES = {"CONV_THREADS": THREADS, "CONV_BLOCKS_PER_SM": BLOCKS_PER_SM, "SPLITK_THREADS": SPLITK_THREADS}
PASSES = ("conv_fwd", "conv_dgrad", "conv_wgrad")


class ConvTile:
    """One TileConfig of conv.cu: data type, tensor cores or not, the block's BM×BN tile of the
    product, BK reduction elements per stage, `stages` buffers in flight."""

    def __init__(self, name, dtype, tensor_cores, bm, bn, bk, stages):
        self.name, self.dtype, self.tensor_cores = name, numpy.dtype(dtype), tensor_cores
        self.bm, self.bn, self.bk, self.stages = bm, bn, bk, stages
        itemsize = self.dtype.itemsize
        chunk = 16 // itemsize if tensor_cores else 1  # elements per async copy, also the row padding
        a = max(bm * (bk + chunk), bk * (bm + chunk))  # A k-major or m-major, whichever a pass uses
        b = max(bn * (bk + chunk), bk * (bn + chunk))
        self.smem_bytes = stages * (a + b) * itemsize

    @property
    def template(self):
        """The C++ type of this configuration."""
        element = "__nv_bfloat16" if self.dtype == BF16 else "float"
        return (f"TileConfig<{element}, {str(self.tensor_cores).lower()}, {self.bm}, {self.bn}, {self.bk}, "
                f"{self.stages}, {self.smem_bytes}>")

    def kernel(self, conv_pass):
        return f"{conv_pass}<{self.template}>"


TILES = {t.name: t for t in (ConvTile("Tf32Tile", numpy.float32, True, 128, 128, 16, 3),
                             ConvTile("Bf16Tile", BF16, True, 128, 128, 32, 3),
                             ConvTile("SimtTile", numpy.float32, False, 64, 64, 16, 2))}
NAMES = tuple(tile.kernel(p) for p in PASSES for tile in TILES.values()) + ("splitk_reduce",)


def conv_geometry(x_shape, w_shape, stride, padding):
    """The kernels' integer arguments: N, H, W, C, K, R, S, P, Q, stride, padding."""
    n, h, w, c = x_shape
    k, r, s, wc = w_shape
    if wc != c:
        raise ValueError(f"conv: {c} input channels but the weight expects {wc}")
    p, q = (h + 2 * padding - r) // stride + 1, (w + 2 * padding - s) // stride + 1
    if p <= 0 or q <= 0:
        raise ValueError(f"conv2d: a {r}x{s} kernel does not fit a {h}x{w} input with padding {padding}")
    return n, h, w, c, k, r, s, p, q, stride, padding


class ConvKernels(Launcher):
    allow_tf32 = True

    def conv_tile(self, dtype, in_channels, out_channels, arrays=()):
        """The conv.cu tile for this data type and these channel counts; the tensor-core tiles
        copy 16 bytes at a time, so they also need the `arrays` 16-byte aligned (fresh arrays are)."""
        aligned = all(data_address(a) % 16 == 0 for a in arrays)
        if dtype == BF16:
            if in_channels % 8 or out_channels % 8 or not aligned:
                raise ValueError("bf16 convolution needs channel counts that are multiples of 8 "
                                 "and 16-byte aligned arrays")
            return TILES["Bf16Tile"]
        if dtype != numpy.float32:
            raise TypeError(f"the convolution kernels take float32 or bf16 (uint16) data, not {dtype}")
        fits = in_channels % 4 == 0 and out_channels % 4 == 0 and aligned
        return TILES["Tf32Tile" if self.allow_tf32 and fits else "SimtTile"]

    def _conv(self, conv_pass, tile, grid, args, geometry):
        self.launch(FAMILY, tile.kernel(conv_pass), grid, (THREADS,), (*args, *i32(*geometry)),
                    shared_mem=tile.smem_bytes)

    def conv_forward(self, x, w, stride, padding):
        """y[n,p,q,k] = Σ_{r,s,c} x_pad[n, p·stride + r, q·stride + s, c] · w[k, r, s, c]."""
        _same_dtype(x, w)
        geometry = conv_geometry(x.shape, w.shape, stride, padding)
        n, _, _, c, k, _, _, p, q = geometry[:9]
        tile = self.conv_tile(x.dtype, c, k, (x, w))
        y = get_array_module(x).empty((n, p, q, k), dtype=x.dtype)
        self._conv("conv_fwd", tile, (ceil_div(n * p * q, tile.bm), ceil_div(k, tile.bn), 1), (x, w, y), geometry)
        return y

    def conv_grad_input(self, gy, w, x_shape, stride, padding):
        """dL/dx, one launch over stride² phases of the input pixels."""
        _same_dtype(gy, w)
        geometry = conv_geometry(x_shape, w.shape, stride, padding)
        n, h, width, c, k = geometry[:5]
        tile = self.conv_tile(gy.dtype, c, k, (gy, w))
        gx = get_array_module(gy).empty(x_shape, dtype=gy.dtype)
        largest_phase = n * ceil_div(h, stride) * ceil_div(width, stride)
        grid = (ceil_div(largest_phase, tile.bm), ceil_div(c, tile.bn), stride * stride)
        self._conv("conv_dgrad", tile, grid, (gy, w, gx), geometry)
        return gx

    def conv_grad_weight(self, x, gy, w_shape, stride, padding):
        """dL/dw in float32 (also for bf16 data), the pixel reduction split across blocks."""
        xp = get_array_module(x)
        geometry = conv_geometry(x.shape, w_shape, stride, padding)
        n, _, _, c, k, r, s, p, q = geometry[:9]
        tile = self.conv_tile(x.dtype, c, k, (x, gy))
        columns = r * s * c
        tiles = (ceil_div(k, tile.bm), ceil_div(columns, tile.bn))
        splits = self.wgrad_splits(tiles[0] * tiles[1], ceil_div(n * p * q, tile.bk))
        gw = xp.empty(w_shape, dtype=numpy.float32)
        out = gw if splits == 1 else xp.empty((splits, k, columns), dtype=numpy.float32)
        self._conv("conv_wgrad", tile, (*tiles, splits), (x, gy, out), geometry)
        if splits > 1:
            self.launch(FAMILY, "splitk_reduce", self.elementwise_grid(gw.size, SPLITK_THREADS), (SPLITK_THREADS,),
                        (out, gw, *i32(gw.size, splits)))
        return gw

    def wgrad_splits(self, output_tiles, k_tiles):
        """How many ranges the pixel reduction is split into: enough blocks for about two per SM,
        each range at least MIN_TILES_PER_SPLIT k-tiles, none of them empty."""
        splits = max(1, min(ceil_div(2 * self.multiprocessors, output_tiles), k_tiles // MIN_TILES_PER_SPLIT, 65535))
        return ceil_div(k_tiles, ceil_div(k_tiles, splits))


def _same_dtype(data, w):
    if data.dtype != w.dtype:
        raise TypeError(f"convolution of {data.dtype} data with a {w.dtype} weight: give the weight in the data's "
                        "type (under --amp, its bf16 copy)")
