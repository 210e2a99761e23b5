"""The CUDA kernels of kernels/*.cu from Python: loading, launch geometry, one method per operation.

On a GPU the ops in minidl.ops call `device()` for float32 and bf16 CuPy arrays (`wants(...)`
decides); everything else keeps the reference path, so CPU users never import CuPy through
this module.

`Kernels(load, multiprocessors)` holds everything that builds a launch: output and workspace
allocation, grids, split-K, argument lists with exact C types (numpy.int32/float32: CuPy would
pass a Python int as 64 bits, and `None` as a bad pointer, hence NULL). `load(family)` returns
an object with CuPy's RawModule interface; on a GPU it is a RawModule compiled once per process
(CuPy also caches the binary on disk) for the device's architecture. tests/kernels passes a CPU
emulator of the same interface, so every line here also runs in CI, on NumPy arrays.

Conventions: NHWC activations, KRSC weights, contiguous arrays. float32 arrays run on TF32
tensor cores when `allow_tf32` (the default, as in cuDNN; MINIDL_TF32=0 turns it off) and the
channel counts allow, else on the exact fp32 path; bf16 data are uint16 arrays holding the raw
bfloat16 bits (backend.BF16: NumPy and CuPy have no bfloat16 dtype) and run on bf16 tensor cores.
Convolution and batch norm take bf16 data (with float32 weights, γ, β and statistics: a weight
is read through its bf16 copy in a registered `Bf16Shadow`); `cast` and `bf16_add` convert and
sum; pooling, the loss and SGD take float32 only and refuse bf16.
`MINIDL_KERNELS=0` keeps even CuPy arrays on the reference path.
"""
import contextlib
import functools
import os
import weakref
from pathlib import Path

import numpy

from minidl.backend import BF16, get_array_module, on_gpu

SOURCE_DIR = Path(__file__).resolve().parent.parent / "kernels"
NULL = numpy.uint64(0)  # a null pointer argument
ENABLED = os.environ.get("MINIDL_KERNELS", "1") != "0"
KERNEL_DTYPES = (numpy.float32, BF16)
_CONV_TILES = ("Tf32Tile", "Bf16Tile", "SimtTile")
_BN_TYPES = ("float", "__nv_bfloat16")

# family (kernels/<family>.cu) -> the kernels it exports, as CuPy name expressions
KERNELS = {
    "sgd": ("sgd_momentum<1>", "sgd_momentum<4>", "sgd_momentum_scalars<1>", "sgd_momentum_scalars<4>",
            "sgd_store_scalars"),
    "amp": ("float_to_bf16", "bf16_to_float", "bf16_add"),
    "softmax_xent": ("softmax_xent",),
    "pool": ("max_pool_forward", "max_pool_backward", "global_avg_pool_forward", "global_avg_pool_backward"),
    "batchnorm": tuple(f"{k}<{t}>" for k in ("bn_stats", "bn_apply", "bn_backward_reduce", "bn_backward_apply")
                       for t in _BN_TYPES) + ("bn_finalize", "bn_backward_finalize"),
    "conv": tuple(f"{k}<{t}>" for k in ("conv_fwd", "conv_dgrad", "conv_wgrad") for t in _CONV_TILES)
    + ("splitk_reduce",),
}


class ConvTile:
    """A tile configuration of conv.cu (TileConfig there): sizes that decide grids and shared memory."""

    def __init__(self, name, itemsize, bm, bn, bk, stages, tensor_cores):
        self.name, self.bm, self.bn, self.bk, self.stages = name, bm, bn, bk, stages
        self.chunk = 16 // itemsize if tensor_cores else 1  # channels per 16-byte copy
        a = max(bm * (bk + self.chunk), bk * (bm + self.chunk))
        b = max(bn * (bk + self.chunk), bk * (bn + self.chunk))
        self.smem_bytes = stages * (a + b) * itemsize  # conv.cu's TileConfig::SMEM_BYTES


CONV_TILES = {t.name: t for t in (ConvTile("Tf32Tile", 4, 128, 128, 16, 3, True),
                                  ConvTile("Bf16Tile", 2, 128, 128, 32, 3, True),
                                  ConvTile("SimtTile", 4, 64, 64, 16, 2, False))}
CONV_THREADS = 256
BN_BLOCK = (32, 8)  # batchnorm.cu: 32 channels × 8 row lanes
BN_FINALIZE_BLOCK = (32, 32)  # batchnorm.cu: 32 channels × 32 slab lanes
THREADS = 256  # the elementwise and pooling kernels
MIN_ROWS_PER_SLAB = 64  # batch norm: below this a slab's fixed cost dominates
MIN_TILES_PER_SPLIT = 8  # wgrad split-K: each split streams at least this many k-tiles


def wants(*arrays):
    """Whether these arrays (None ignored) go to the kernels: CuPy float32 or bf16 arrays on a GPU."""
    return ENABLED and on_gpu and all(
        a is None or (not isinstance(a, numpy.ndarray) and a.dtype in KERNEL_DTYPES) for a in arrays)


def data_address(array):
    return array.data.ptr if hasattr(array.data, "ptr") else array.ctypes.data


def ceil_div(a, b):
    return -(-a // b)


def _i32(*values):
    return tuple(numpy.int32(v) for v in values)


def _ptr(array):
    return NULL if array is None else array


def _elementwise_grid(count, multiprocessors):
    return (max(1, min(ceil_div(count, THREADS), 32 * multiprocessors)),)


def _require_float32(*arrays):
    """The kernels without a bf16 version: a bf16 array here is a policy error, not a slow path."""
    for a in arrays:
        if a is not None and a.dtype != numpy.float32:
            raise TypeError(f"this kernel takes float32 data, not {a.dtype} (bf16 is cast back to float32 "
                            "before pooling, the classifier and the loss: minidl.ops.to_float)")


class Bf16Shadow:
    """A bf16 copy of a float32 buffer (the flat parameters), made by one launch per `refresh()`.
    A convolution given bf16 data and a float32 weight that is a view into the buffer reads the
    weight's bf16 copy here, found by address: under --amp the weights are cast once per step,
    not at every use. Refresh after every change of the buffer (each optimizer step) and before
    the next forward pass; a stale shadow means stale weights."""

    def __init__(self, kernels, master):
        if master.dtype != numpy.float32 or master.ndim != 1:
            raise TypeError("a bf16 shadow copies a 1-D float32 buffer")
        self.kernels, self.master = kernels, master
        self.bits = get_array_module(master).empty(master.shape, dtype=BF16)

    def refresh(self):
        self.kernels.cast(self.master, BF16, out=self.bits)

    def view_of(self, w):
        """w's bf16 copy, or None where w is not a contiguous part of the buffer whose copy is
        16-byte aligned (the tensor-core tiles copy 16 bytes at a time)."""
        offset = data_address(w) - data_address(self.master)
        inside = 0 <= offset and offset + w.nbytes <= self.master.nbytes and offset % self.master.itemsize == 0
        if not (inside and w.dtype == numpy.float32 and w.flags.c_contiguous):
            return None
        start = offset // self.master.itemsize
        view = self.bits[start:start + w.size].reshape(w.shape)
        return view if data_address(view) % 16 == 0 else None


class Kernels:
    """Every kernel operation, launched through `load(family).get_function(name)`."""

    def __init__(self, load, multiprocessors, allow_tf32=True):
        self._load = load
        self.multiprocessors = multiprocessors
        self.allow_tf32 = allow_tf32
        self._functions = {}
        self._shared_opt_in = {}  # (family, name) -> dynamic shared memory allowed above 48 KiB
        self._shadows = weakref.WeakSet()
        self._sgd_scalars = None  # (device array, launch) inside sgd_scalars()
        self._sgd_updates = 0

    def _launch(self, family, name, grid, block, args, shared_mem=0):
        key = (family, name)
        function = self._functions.get(key)
        if function is None:
            function = self._functions[key] = self._load(family).get_function(name)
        if shared_mem > self._shared_opt_in.get(key, 48 * 1024):  # the opt-in above 48 KiB, once:
            function.max_dynamic_shared_size_bytes = shared_mem   # reading the attribute is a driver call
            self._shared_opt_in[key] = shared_mem
        function(grid, block, args, shared_mem=shared_mem)

    # ---- SGD ---------------------------------------------------------------------------------
    def sgd_momentum_update(self, w, g, u, lr, momentum, grad_scale=1.0, decay=None, nesterov=False,
                            rate_inside=False, velocity_scale=1.0):
        """In place on the flat buffers, exactly as minidl.ops.sgd.sgd_momentum_update (inside
        `sgd_scalars()`, lr, grad_scale and velocity_scale go through device memory)."""
        _require_float32(w, g, u, decay)
        n = w.size
        buffers = [a for a in (w, g, u, decay) if a is not None]
        vector = 4 if n % 4 == 0 and all(data_address(a) % 16 == 0 for a in buffers) else 1
        grid = _elementwise_grid(n // vector, self.multiprocessors)
        flags = numpy.int32(bool(nesterov)), numpy.int32(bool(rate_inside))
        if self._sgd_scalars is None:
            self._launch("sgd", f"sgd_momentum<{vector}>", grid, (THREADS,),
                         (w, g, u, _ptr(decay), numpy.int32(n), numpy.float32(lr), numpy.float32(momentum),
                          numpy.float32(grad_scale), *flags, numpy.float32(velocity_scale)))
            return
        scalars, launch = self._sgd_scalars
        self._sgd_updates += 1
        if launch:
            self._launch("sgd", f"sgd_momentum_scalars<{vector}>", grid, (THREADS,),
                         (w, g, u, _ptr(decay), numpy.int32(n), scalars, numpy.float32(momentum), *flags))
        else:
            self._launch("sgd", "sgd_store_scalars", (1,), (1,),
                         (scalars, numpy.float32(lr), numpy.float32(grad_scale), numpy.float32(velocity_scale)))

    @contextlib.contextmanager
    def sgd_scalars(self, scalars, launch):
        """Inside, `sgd_momentum_update` takes lr, grad_scale and velocity_scale through the
        device array `scalars` (float32, 3 elements) instead of its arguments, which a CUDA graph
        would freeze at capture: with launch=True it launches the update that reads them there
        when it runs (what the graph captures); with launch=False it stores its arguments there
        and updates nothing (before each replay). Exactly one update must be asked for inside."""
        if self._sgd_scalars is not None:
            raise RuntimeError("sgd_scalars() does not nest")
        if scalars.dtype != numpy.float32 or scalars.size != 3:
            raise TypeError("sgd_scalars() takes a float32 device array of 3 elements")
        self._sgd_scalars, self._sgd_updates = (scalars, launch), 0
        try:
            yield
        finally:
            self._sgd_scalars = None
        if self._sgd_updates != 1:
            raise RuntimeError(f"one SGD update was expected inside sgd_scalars(), not {self._sgd_updates}: "
                               "only an optimizer built on sgd_momentum_update can be replayed from a graph")

    # ---- bf16 (--amp) --------------------------------------------------------------------------
    def cast(self, x, dtype, out=None):
        """x as float32 or bf16 (BF16 bits): to bf16 rounds to nearest even, to float32 is exact."""
        if x.dtype == dtype and out is None:
            return x
        names = {(numpy.dtype(numpy.float32), numpy.dtype(BF16)): "float_to_bf16",
                 (numpy.dtype(BF16), numpy.dtype(numpy.float32)): "bf16_to_float"}
        name = names.get((x.dtype, numpy.dtype(dtype)))
        if name is None:
            raise TypeError(f"the cast kernels convert between float32 and bf16, not {x.dtype} to {dtype}")
        x = get_array_module(x).ascontiguousarray(x)
        y = get_array_module(x).empty(x.shape, dtype=dtype) if out is None else out
        if y.shape != x.shape or y.dtype != dtype:
            raise ValueError(f"cast: out is {y.dtype} {y.shape}, {numpy.dtype(dtype)} {x.shape} expected")
        self._launch("amp", name, _elementwise_grid(x.size, self.multiprocessors), (THREADS,),
                     (x, y, numpy.int64(x.size)))
        return y

    def bf16_add(self, a, b):
        """a + b of two bf16 arrays, summed in fp32 and rounded once."""
        if a.dtype != BF16 or b.dtype != BF16 or a.shape != b.shape:
            raise TypeError(f"bf16_add adds two bf16 arrays of one shape, not {a.dtype} {a.shape} "
                            f"and {b.dtype} {b.shape}")
        xp = get_array_module(a)
        a, b = xp.ascontiguousarray(a), xp.ascontiguousarray(b)
        y = xp.empty_like(a)
        self._launch("amp", "bf16_add", _elementwise_grid(a.size, self.multiprocessors), (THREADS,),
                     (a, b, y, numpy.int64(a.size)))
        return y

    def bf16_shadow(self, master):
        """The registered `Bf16Shadow` of the float32 buffer `master`, registered while it lives:
        one per buffer, so that whoever refreshes it refreshes the copy the convolutions read."""
        shadow = next((s for s in self._shadows if s.master is master), None)
        if shadow is None:
            shadow = Bf16Shadow(self, master)
            self._shadows.add(shadow)
        return shadow

    def weight_like(self, data, w):
        """The weight w in the data's type: for bf16 data and a float32 w, w's copy in a registered
        shadow (nothing to compute), else a fresh cast."""
        if data.dtype == w.dtype:
            return w
        if data.dtype != BF16:
            raise TypeError(f"convolution of {data.dtype} data with a {w.dtype} weight")
        for shadow in self._shadows:
            view = shadow.view_of(w)
            if view is not None:
                return view
        return self.cast(w, BF16)

    # ---- softmax cross-entropy -----------------------------------------------------------------
    def softmax_cross_entropy(self, logits, labels, smoothing):
        """(mean loss as a 0-d array, d loss / d logits) for integer labels."""
        _require_float32(logits)
        xp = get_array_module(logits)
        n, k = logits.shape
        labels = xp.ascontiguousarray(labels, dtype=numpy.int64)
        row_loss, grad = xp.empty(n, dtype=numpy.float32), xp.empty_like(logits)
        self._launch("softmax_xent", "softmax_xent", (n,), (THREADS,),
                     (logits, labels, numpy.int32(k), numpy.float32(smoothing), numpy.float32(1.0 / n), row_loss,
                      grad))
        return row_loss.mean(), grad

    # ---- pooling -----------------------------------------------------------------------------
    def max_pool_forward(self, x, kernel, stride, padding):
        """(y, argmax): argmax holds each window's first maximum as r·kernel + s (uint8)."""
        _require_float32(x)
        xp = get_array_module(x)
        n, h, w, c = x.shape
        p, q = (h + 2 * padding - kernel) // stride + 1, (w + 2 * padding - kernel) // stride + 1
        y, argmax = xp.empty((n, p, q, c), dtype=x.dtype), xp.empty((n, p, q, c), dtype=numpy.uint8)
        self._launch("pool", "max_pool_forward", _elementwise_grid(y.size, self.multiprocessors), (THREADS,),
                     (x, y, argmax, *_i32(n, h, w, c, p, q, kernel, stride, padding)))
        return y, argmax

    def max_pool_backward(self, gy, argmax, x_shape, kernel, stride, padding):
        _require_float32(gy)
        xp = get_array_module(gy)
        n, h, w, c = x_shape
        gx = xp.empty(x_shape, dtype=gy.dtype)
        self._launch("pool", "max_pool_backward", _elementwise_grid(gx.size, self.multiprocessors), (THREADS,),
                     (gy, argmax, gx, *_i32(n, h, w, c, gy.shape[1], gy.shape[2], kernel, stride, padding)))
        return gx

    def global_avg_pool_forward(self, x):
        _require_float32(x)
        xp = get_array_module(x)
        n, h, w, c = x.shape
        y = xp.empty((n, c), dtype=x.dtype)
        self._launch("pool", "global_avg_pool_forward", _elementwise_grid(n * c, self.multiprocessors), (THREADS,),
                     (x, y, *_i32(n, h * w, c)))
        return y

    def global_avg_pool_backward(self, gy, x_shape):
        _require_float32(gy)
        xp = get_array_module(gy)
        n, h, w, c = x_shape
        gx = xp.empty(x_shape, dtype=gy.dtype)
        self._launch("pool", "global_avg_pool_backward", _elementwise_grid(gx.size, self.multiprocessors),
                     (THREADS,), (gy, gx, *_i32(n, h * w, c)))
        return gx

    # ---- batch norm ----------------------------------------------------------------------------
    def _bn_grid(self, rows, channels):
        """(grid, rows per slab): enough blocks to fill the GPU about 8 times over."""
        channel_blocks = ceil_div(channels, BN_BLOCK[0])
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
        t = _bn_type(x)
        grid, per_slab = self._bn_grid(rows, channels)
        mean, inv_std, scale, shift = (xp.empty(channels, dtype=numpy.float32) for _ in range(4))
        if training:
            partial = xp.empty((grid[1], 3, channels), dtype=numpy.float32)
            self._launch("batchnorm", f"bn_stats<{t}>", grid, BN_BLOCK, (x, *_i32(rows, channels, per_slab), partial))
            stats = (partial, numpy.int32(grid[1]))
        else:
            stats = (NULL, numpy.int32(0))
        self._launch("batchnorm", "bn_finalize", grid[:1], BN_FINALIZE_BLOCK,
                     (*stats, *_i32(channels, rows), gamma, beta, numpy.float32(eps), numpy.float32(momentum),
                      _ptr(running_mean), _ptr(running_var), mean, inv_std, scale, shift))
        y = xp.empty_like(x)
        self._launch("batchnorm", f"bn_apply<{t}>", grid, BN_BLOCK,
                     (x, _ptr(residual), scale, shift, y, *_i32(rows, channels, per_slab, bool(relu))))
        return y, (mean, inv_std, scale)

    def batch_norm_backward(self, gy, x, saved, training, y=None, residual_grad=False):
        """(dx, dγ, dβ, d_residual or None). `saved` is batch_norm_forward's; `y` its output when
        the forward fused a ReLU (the mask), and residual_grad asks for the residual's gradient."""
        xp = get_array_module(gy)
        mean, inv_std, scale = saved
        channels = x.shape[-1]
        rows = x.size // channels
        t = _bn_type(x)
        grid, per_slab = self._bn_grid(rows, channels)
        partial = xp.empty((grid[1], 2, channels), dtype=numpy.float32)
        self._launch("batchnorm", f"bn_backward_reduce<{t}>", grid, BN_BLOCK,
                     (gy, x, _ptr(y), mean, *_i32(rows, channels, per_slab), partial))
        ggamma, gbeta, k1, k0 = (xp.empty(channels, dtype=numpy.float32) for _ in range(4))
        self._launch("batchnorm", "bn_backward_finalize", grid[:1], BN_FINALIZE_BLOCK,
                     (partial, *_i32(grid[1], channels, rows), inv_std, scale, numpy.int32(bool(training)),
                      ggamma, gbeta, k1, k0))
        gx = xp.empty_like(x)
        gresidual = xp.empty_like(x) if residual_grad else None
        self._launch("batchnorm", f"bn_backward_apply<{t}>", grid, BN_BLOCK,
                     (gy, x, _ptr(y), mean, scale, k1, k0, gx, _ptr(gresidual), *_i32(rows, channels, per_slab)))
        return gx, ggamma, gbeta, gresidual

    # ---- convolution ---------------------------------------------------------------------------
    def conv_tile(self, dtype, in_channels, out_channels, arrays=()):
        """The conv.cu tile for this data type and these channel counts; the tensor-core tiles
        copy 16 bytes at a time, so they also need the `arrays` 16-byte aligned (fresh arrays are)."""
        aligned = all(data_address(a) % 16 == 0 for a in arrays)
        if dtype == BF16:
            if in_channels % 8 or out_channels % 8 or not aligned:
                raise ValueError("bf16 convolution needs channel counts that are multiples of 8 "
                                 "and 16-byte aligned arrays")
            return CONV_TILES["Bf16Tile"]
        if dtype != numpy.float32:
            raise TypeError(f"the convolution kernels take float32 or bf16 (uint16) data, not {dtype}")
        fits = in_channels % 4 == 0 and out_channels % 4 == 0 and aligned
        return CONV_TILES["Tf32Tile" if self.allow_tf32 and fits else "SimtTile"]

    def _conv(self, kernel, tile, grid, args, geometry):
        self._launch("conv", f"{kernel}<{tile.name}>", grid, (CONV_THREADS,), (*args, *_i32(*geometry)),
                     shared_mem=tile.smem_bytes)

    def conv_forward(self, x, w, stride, padding):
        """y[n,p,q,k] = Σ_{r,s,c} x_pad[n, p·stride + r, q·stride + s, c] · w[k, r, s, c]."""
        xp = get_array_module(x)
        w = self.weight_like(x, w)
        geometry = conv_geometry(x.shape, w.shape, stride, padding)
        n, _, _, c, k, _, _, p, q = geometry[:9]
        tile = self.conv_tile(x.dtype, c, k, (x, w))
        y = xp.empty((n, p, q, k), dtype=x.dtype)
        self._conv("conv_fwd", tile, (ceil_div(n * p * q, tile.bm), ceil_div(k, tile.bn), 1), (x, w, y), geometry)
        return y

    def conv_grad_input(self, gy, w, x_shape, stride, padding):
        """dL/dx, one launch over stride² phases of the input pixels."""
        xp = get_array_module(gy)
        w = self.weight_like(gy, w)
        geometry = conv_geometry(x_shape, w.shape, stride, padding)
        n, h, width, c, k = geometry[:5]
        tile = self.conv_tile(gy.dtype, c, k, (gy, w))
        gx = xp.empty(x_shape, dtype=gy.dtype)
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
            self._launch("conv", "splitk_reduce", _elementwise_grid(gw.size, self.multiprocessors), (THREADS,),
                         (out, gw, *_i32(gw.size, splits)))
        return gw

    def wgrad_splits(self, output_tiles, k_tiles):
        """How many ranges the pixel reduction is split into: enough blocks for about two per SM,
        each range at least MIN_TILES_PER_SPLIT k-tiles, none of them empty."""
        splits = max(1, min(ceil_div(2 * self.multiprocessors, output_tiles), k_tiles // MIN_TILES_PER_SPLIT, 65535))
        return ceil_div(k_tiles, ceil_div(k_tiles, splits))


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


def _bn_type(x):
    return "__nv_bfloat16" if x.dtype == BF16 else "float"


# ---- the GPU ---------------------------------------------------------------------------------

def cuda_include_dir():
    """A directory holding CUDA's headers (mma.h): NVRTC needs it to compile conv.cu."""
    candidates = [os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    try:
        import cupy
        candidates.append(cupy.cuda.get_cuda_path() or "")
    except ImportError:
        pass
    import importlib.util
    for wheel in ("nvidia.cu13", "nvidia.cuda_runtime"):  # the headers pip wheels carry
        try:
            spec = importlib.util.find_spec(wheel)
        except ImportError:
            spec = None
        if spec and spec.submodule_search_locations:
            candidates.append(list(spec.submodule_search_locations)[0])
    for root in candidates:
        if root and (Path(root) / "include" / "mma.h").exists():
            return str(Path(root) / "include")
    return None


def compile_options():
    """NVRTC options for every kernel family (CuPy adds -arch from the device)."""
    include = cuda_include_dir()
    return ("--std=c++17",) + ((f"-I{include}",) if include else ())


@functools.lru_cache(maxsize=None)
def load_rawmodule(family):
    """kernels/<family>.cu as a cupy.RawModule, compiled once per process for this GPU."""
    import cupy
    source = (SOURCE_DIR / f"{family}.cu").read_text()
    return cupy.RawModule(code=source, options=compile_options(), name_expressions=KERNELS[family])


@functools.lru_cache(maxsize=None)
def device():
    """The Kernels of the current GPU."""
    import cupy
    multiprocessors = cupy.cuda.Device().attributes["MultiProcessorCount"]
    return Kernels(load_rawmodule, multiprocessors, allow_tf32=os.environ.get("MINIDL_TF32", "1") != "0")
