"""Every kernel of kernels/*.cu, run by the CPU emulator through minidl.kernels, against the
reference ops (oracle.py) on small shapes chosen to hit the edges: sizes that do not divide
the tiles, batch 1, the 3-channel 7×7 stride-2 stem, strides 1 and 2, several blocks along
every grid axis, split-K, ties in max pooling, |mean| ≫ std in batch norm."""
import numpy
import pytest

import oracle
from minidl.intmath import ceil_div
from minidl.kernels.batchnorm import FINALIZE_LANES
from minidl.kernels.conv import TILES
from minidl.ops.conv import correlate

# mode, n, h, w, c, k, r, stride, padding, the tile that must run
CONV_CASES = {
    "3x3 s1, odd image": ("tf32", 2, 7, 6, 16, 24, 3, 1, 1, "Tf32Tile"),
    "3x3 s2, batch 1": ("tf32", 1, 9, 9, 8, 20, 3, 2, 1, "Tf32Tile"),
    "1x1 s2, phases without taps": ("tf32", 2, 7, 7, 12, 8, 1, 2, 0, "Tf32Tile"),
    "1x1 s1, two column tiles": ("tf32", 3, 5, 5, 32, 136, 1, 1, 0, "Tf32Tile"),
    "3x3 s1, three row tiles, split-K": ("tf32", 2, 12, 12, 8, 8, 3, 1, 1, "Tf32Tile"),
    "3x3 s2, 64 channels, 36 k-tiles": ("tf32", 1, 8, 8, 64, 64, 3, 2, 1, "Tf32Tile"),
    "3x3 s2, no padding": ("tf32", 1, 9, 9, 8, 8, 3, 2, 0, "Tf32Tile"),
    "7x7 s2 stem, C=3": ("tf32", 1, 15, 15, 3, 8, 7, 2, 3, "SimtTile"),
    "7x7 s2 stem, C=3, split-K": ("tf32", 3, 20, 20, 3, 8, 7, 2, 3, "SimtTile"),
    "fp32 5x5 s3: nine phases": ("fp32", 1, 10, 10, 4, 4, 5, 3, 2, "SimtTile"),
    "fp32, odd channels, s2": ("fp32", 2, 6, 5, 5, 7, 3, 2, 1, "SimtTile"),
    "fp32, two column tiles": ("fp32", 1, 9, 9, 16, 72, 3, 1, 1, "SimtTile"),
    "bf16 3x3 s1": ("bf16", 2, 7, 6, 16, 24, 3, 1, 1, "Bf16Tile"),
    "bf16 3x3 s2, batch 1": ("bf16", 1, 9, 9, 8, 16, 3, 2, 1, "Bf16Tile"),
    "bf16 1x1 s2, two column tiles": ("bf16", 2, 5, 5, 24, 136, 1, 2, 0, "Bf16Tile"),
    "bf16 3x3 s1, split-K": ("bf16", 2, 16, 16, 8, 8, 3, 1, 1, "Bf16Tile"),
    "bf16 7x7 s2": ("bf16", 1, 11, 11, 8, 16, 7, 2, 3, "Bf16Tile"),
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv(emulated, case):
    mode, n, h, w, c, k, r, stride, padding, tile = CONV_CASES[case]
    oracle.check_conv(emulated, numpy, mode, n, h, w, c, k, r, stride, padding, tile=tile)


@pytest.mark.parametrize("case", [c for c in CONV_CASES if "split-K" in c])
def test_split_k_cases_split(emulated, case):
    """The split-K cases above really split the pixel reduction (and leave no split empty)."""
    _, n, h, w, c, k, r, stride, padding, tile = CONV_CASES[case]
    t = TILES[tile]
    pixels = n * ((h + 2 * padding - r) // stride + 1) * ((w + 2 * padding - r) // stride + 1)
    k_tiles = ceil_div(pixels, t.bk)
    splits = emulated.wgrad_splits(ceil_div(k, t.bm) * ceil_div(r * r * c, t.bn), k_tiles)
    assert splits > 1 and (splits - 1) * ceil_div(k_tiles, splits) < k_tiles


# mode, NHWC shape, training, fused, mean offset
BN_CASES = {
    "two channel blocks, one slab": ("fp32", (2, 5, 3, 37), True, None, 0.0),
    "five slabs": ("fp32", (3, 9, 11, 40), True, None, 0.0),
    "relu, batch 1": ("fp32", (1, 7, 9, 64), True, "relu", 0.0),
    "add+relu": ("fp32", (2, 8, 9, 33), True, "add_relu", 0.0),
    "eval": ("fp32", (2, 6, 7, 40), False, None, 0.0),
    "eval add+relu": ("fp32", (2, 6, 7, 24), False, "add_relu", 0.0),
    "mean 1000 x std": ("fp32", (3, 9, 11, 16), True, None, 1000.0),
    "bf16 relu": ("bf16", (3, 9, 11, 40), True, "relu", 0.0),
    "bf16 add+relu": ("bf16", (2, 8, 9, 33), True, "add_relu", 0.0),
}


@pytest.mark.parametrize("case", BN_CASES)
def test_batch_norm(emulated, case):
    mode, shape, training, fused, offset = BN_CASES[case]
    oracle.check_batch_norm(emulated, numpy, mode, shape, training, fused, offset=offset)


@pytest.mark.parametrize("mode, fused", [("fp32", None), ("bf16", "add_relu")])
def test_batch_norm_with_more_slabs_than_finalize_lanes(emulated_wide, mode, fused):
    """70 slabs: the finalize kernels' 32 lanes take two or three slabs each."""
    shape = (5, 28, 32, 16)
    (_, slabs), _ = emulated_wide._bn_grid(5 * 28 * 32, 16)
    assert slabs == 70 > 2 * FINALIZE_LANES
    oracle.check_batch_norm(emulated_wide, numpy, mode, shape, True, fused, offset=3.0)


@pytest.mark.parametrize("shape, kernel, stride, padding, levels", [
    ((2, 9, 7, 5), 3, 2, 1, 3),     # the stem's pool, odd sizes, ties everywhere
    ((1, 8, 8, 16), 3, 2, 1, None),
    ((2, 6, 6, 3), 2, 2, 0, 2),
])
def test_max_pool(emulated, shape, kernel, stride, padding, levels):
    oracle.check_max_pool(emulated, numpy, shape, kernel, stride, padding, levels=levels)


@pytest.mark.parametrize("shape", [(3, 3, 5, 7), (2, 7, 7, 40)])
def test_global_avg_pool(emulated, shape):
    oracle.check_global_avg_pool(emulated, numpy, shape)


@pytest.mark.parametrize("n, classes, smoothing, scale", [
    (5, 1000, 0.1, 1.0),   # ImageNet's classes: four per thread
    (3, 10, 0.0, 1.0),     # fewer classes than threads
    (4, 37, 0.2, 1e3),     # logits of 1e3: exp would overflow without the shift
])
def test_softmax_xent(emulated, n, classes, smoothing, scale):
    oracle.check_softmax_xent(emulated, numpy, n, classes, smoothing, scale=scale)


@pytest.mark.parametrize("n, nesterov, decay, offset, rate_inside", [
    (1000, False, True, 0, False),   # float4 path
    (1003, True, False, 0, False),   # n not a multiple of 4: scalar path
    (4096, True, True, 1, False),    # a view 4 bytes off 16-byte alignment: scalar path
    (4096, False, False, 0, False),
    (1000, False, True, 0, True),    # Caffe2's form with momentum correction, float4 path
    (1003, False, True, 0, True),    # ... and the scalar path
])
def test_sgd_bit_exact(emulated, n, nesterov, decay, offset, rate_inside):
    oracle.check_sgd(emulated, numpy, n, nesterov, decay, offset=offset, rate_inside=rate_inside)


def test_conv_on_a_misaligned_view_is_right(emulated):
    """A view 4 bytes into its allocation cannot feed 16-byte copies: it is copied to an aligned
    buffer (the emulator would reject a misaligned cp.async) and the result is still right."""
    rng = numpy.random.default_rng(0)
    buffer = rng.standard_normal(2 * 6 * 6 * 8 + 1).astype(numpy.float32)
    x = buffer[1:].reshape(2, 6, 6, 8)
    w = rng.standard_normal((8, 3, 3, 8)).astype(numpy.float32)
    assert emulated.conv_tile(x.dtype, 8, 8).name == "Tf32Tile"
    y = emulated.conv_forward(x, w, 1, 1)
    oracle.assert_close(y, correlate(x.astype(numpy.float64), w.astype(numpy.float64), 1, 1),
                        oracle.TOLERANCE["tf32"], "conv forward on a misaligned view")
