"""Launcher of kernels/conv.cu: implicit-GEMM convolution, forward, grad-input, grad-weight.

NHWC activations, KRSC weights; float32 runs on TF32 tensor cores where allowed and the
channels fit, else in exact fp32; bf16 on bf16 tensor cores. A tile configuration (`ConvTile`)
is written once, here, and reaches conv.cu as template arguments, so the grid and the kernel's
tile cannot disagree.

Details: docs/kernels.md, "minidl/kernels/conv.py".
"""
import numpy

from minidl.backend import BF16, get_array_module
from minidl.intmath import ceil_div
from minidl.kernels import conv_v0, conv_v2, conv_v3
from minidl.kernels.conv_v2 import PASSES
from minidl.kernels.autotune import TOLERANCE, Plan
from minidl.kernels.launch import Launcher, cxx_type, data_address, i32

FAMILY = "conv"
THREADS = 256  # every tile's block
BLOCKS_PER_SM = 2  # the register budget: at most 65536 / (THREADS · BLOCKS_PER_SM) per thread
SPLITK_THREADS = 256
MIN_TILES_PER_SPLIT = 8  # wgrad split-K: each split streams at least this many k-tiles
DEFINES = {"CONV_THREADS": THREADS, "CONV_BLOCKS_PER_SM": BLOCKS_PER_SM, "SPLITK_THREADS": SPLITK_THREADS}
# the Plan versions after v1, each with its launcher module (TILES, launch, FUSIONS, ARCH where it
# needs one): the plans the tuner offers beside v1's, each validated by the canary first
LATER_VERSIONS = {"v2": conv_v2, "v3": conv_v3}


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
        return (f"TileConfig<{cxx_type(self.dtype)}, {str(self.tensor_cores).lower()}, {self.bm}, {self.bn}, "
                f"{self.bk}, {self.stages}, {self.smem_bytes}>")

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
    """The three convolution passes. Each call runs a `Plan` (kernel version, tile, split):
    given, or chosen among `plans(...)` by the autotuner (`tuner`), or without one the first,
    the v1 kernel that has run on GPUs before."""
    allow_tf32 = True
    tuner = None  # a minidl.kernels.autotune.Autotuner, or None

    def conv_tile(self, dtype, in_channels, out_channels):
        """The conv.cu tile for this data type and these channel counts (the operands are 16-byte
        aligned: `aligned`)."""
        if dtype == BF16:
            if in_channels % 8 or out_channels % 8:
                raise ValueError("bf16 convolution needs channel counts that are multiples of 8")
            return TILES["Bf16Tile"]
        if dtype != numpy.float32:
            raise TypeError(f"the convolution kernels take float32 or bf16 (uint16) data, not {dtype}")
        fits = in_channels % 4 == 0 and out_channels % 4 == 0
        return TILES["Tf32Tile" if self.allow_tf32 and fits else "SimtTile"]

    @staticmethod
    def aligned(*arrays):
        """The operands 16-byte aligned, as the tensor-core tiles' 16-byte copies need: a view
        with a storage offset off that alignment is copied to a fresh array (fresh ones are)."""
        return tuple(a if a is None or data_address(a) % 16 == 0 else a.copy() for a in arrays)

    def conv_forward(self, x, w, stride, padding, plan=None):
        """y[n,p,q,k] = Σ_{r,s,c} x_pad[n, p·stride + r, q·stride + s, c] · w[k, r, s, c]."""
        _same_dtype(x, w)
        geometry = conv_geometry(x.shape, w.shape, stride, padding)
        n, _, _, _, k, _, _, p, q = geometry[:9]
        y = get_array_module(x).empty((n, p, q, k), dtype=x.dtype)
        return self._run("conv_fwd", geometry, self.aligned(x, w), y, plan)

    def conv_grad_input(self, gy, w, x_shape, stride, padding, plan=None):
        """dL/dx, one launch over stride² phases of the input pixels."""
        _same_dtype(gy, w)
        geometry = conv_geometry(x_shape, w.shape, stride, padding)
        dx = get_array_module(gy).empty(x_shape, dtype=gy.dtype)
        return self._run("conv_dgrad", geometry, self.aligned(gy, w), dx, plan)

    def conv_grad_weight(self, x, gy, w_shape, stride, padding, plan=None):
        """dL/dw in float32 (also for bf16 data), the pixel reduction split across blocks."""
        geometry = conv_geometry(x.shape, w_shape, stride, padding)
        return self._run("conv_wgrad", geometry, self.aligned(x, gy),
                         get_array_module(x).empty(w_shape, dtype=numpy.float32), plan)

    def _run(self, conv_pass, geometry, operands, out, plan):
        if plan is None:
            plan = self.tuned_plan(conv_pass, operands, geometry, lambda: self.plans(conv_pass, operands, geometry),
                                   lambda candidate: (self._run(conv_pass, geometry, operands, out, candidate),))
        family = LATER_VERSIONS.get(plan.version)
        if family is not None:
            family.launch(self, conv_pass, family.TILES[plan.tile], plan.splits, geometry, *operands, out)
            return out
        if plan.version == "v0":  # only when asked for: plans() never offers it
            return conv_v0.launch(self, conv_pass, geometry, *operands, out)
        return self._run_v1(conv_pass, TILES[plan.tile], plan.splits, geometry, operands, out)

    def tuned_plan(self, conv_pass, operands, geometry, candidates, run, fusion=None, outputs=None):
        """The plan of a pass: the v1 kernel's without a tuner, else the tuner's choice among
        `candidates()` (`run(plan)` timed, `outputs(run(plan))` compared with v1's: see
        Autotuner.choose), remembered under a key of everything they depend on: the pass (and
        its `fusion`), the shape, and the v1 tile, which stands for the data type and TF32."""
        first = self.v1_plan(conv_pass, operands, geometry)
        if self.tuner is None:
            return first
        kind = conv_v2.kernel_kind(conv_pass, fusion.bits if fusion is not None else 0)
        groups = f" in groups of {fusion.group_images}" if fusion is not None else ""
        key = f"{kind}{groups} {first.tile} {'x'.join(map(str, geometry))}"
        tolerance = TOLERANCE["bf16" if operands[0].dtype == BF16 else "tf32"]
        return self.tuner.choose(key, candidates, run, kind, tolerance, outputs)

    def v1_plan(self, conv_pass, operands, geometry):
        tile = self.conv_tile(operands[0].dtype, geometry[3], geometry[4])
        return Plan("v1", tile.name, self._v1_splits(conv_pass, tile, geometry))

    def plans(self, conv_pass, operands, geometry):
        """Every plan that computes this pass here, the v1 kernel's first: v2 and v3 tiles need the
        v1 tile's tensor cores (TF32 allowed for float32, channel counts that fit); each may split
        its reduction where the grid alone would leave multiprocessors idle (grad-weight: around
        the v1 split). v3's are offered on every device: where the device cannot run them (below
        sm_90a) the canary records them unavailable and the tuner never runs them."""
        first = self.v1_plan(conv_pass, operands, geometry)
        if not TILES[first.tile].tensor_cores:
            return [first]
        dtype = operands[0].dtype
        found = [first]
        for version, family in LATER_VERSIONS.items():
            for tile in family.TILES.values():
                if tile.fits(conv_pass, dtype, geometry):
                    found += [Plan(version, tile.name, splits) for splits in self._splits(conv_pass, tile, geometry)]
        return found

    def _splits(self, conv_pass, tile, geometry):
        grid = tile.grid(conv_pass, geometry, 1)
        blocks, k_tiles = grid[0] * grid[1] * grid[2], tile.k_tiles(conv_pass, geometry)
        wanted = self.wgrad_splits(blocks, k_tiles) if conv_pass == "conv_wgrad" else \
            max(1, min(ceil_div(self.multiprocessors, blocks), k_tiles // MIN_TILES_PER_SPLIT, conv_v2.MAX_SPLITS))
        return sorted({1, wanted, max(1, wanted // 2)} if wanted > 1 else {1})

    def _v1_splits(self, conv_pass, tile, geometry):
        if conv_pass != "conv_wgrad":
            return 1
        n, _, _, c, k, r, s, p, q = geometry[:9]
        return self.wgrad_splits(ceil_div(k, tile.bm) * ceil_div(r * s * c, tile.bn), ceil_div(n * p * q, tile.bk))

    def _run_v1(self, conv_pass, tile, splits, geometry, operands, out):
        n, h, w, c, k, r, s, p, q, stride = geometry[:10]
        if conv_pass == "conv_fwd":
            grid = (ceil_div(n * p * q, tile.bm), ceil_div(k, tile.bn), 1)
        elif conv_pass == "conv_dgrad":
            grid = (ceil_div(n * ceil_div(h, stride) * ceil_div(w, stride), tile.bm), ceil_div(c, tile.bn), stride * stride)
        else:
            grid = (ceil_div(k, tile.bm), ceil_div(r * s * c, tile.bn), splits)
        target = out if splits == 1 else get_array_module(out).empty((splits, k, r * s * c), dtype=numpy.float32)
        self.launch(FAMILY, tile.kernel(conv_pass), grid, (THREADS,), (*operands, target, *i32(*geometry)),
                    shared_mem=tile.smem_bytes)
        if splits > 1:
            self.launch(FAMILY, "splitk_reduce", self.elementwise_grid(out.size, SPLITK_THREADS), (SPLITK_THREADS,),
                        (target, out, *i32(out.size, splits)))
        return out

    def wgrad_splits(self, output_tiles, k_tiles):
        """How many ranges a reduction is split into: enough blocks for about two per SM, each
        range at least MIN_TILES_PER_SPLIT k-tiles, none of them empty."""
        splits = max(1, min(ceil_div(2 * self.multiprocessors, output_tiles), k_tiles // MIN_TILES_PER_SPLIT, 65535))
        return ceil_div(k_tiles, ceil_div(k_tiles, splits))


def _same_dtype(data, w):
    if data.dtype != w.dtype:
        raise TypeError(f"convolution of {data.dtype} data with a {w.dtype} weight: give the weight in the data's "
                        "type (under --amp, its bf16 copy)")
