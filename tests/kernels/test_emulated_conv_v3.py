"""The v3 convolution kernels (kernels/conv_v3.cu, wgmma) on the CPU emulator: every tile and
pass against the float64 reference of minidl.ops.conv on shapes that divide no tile (batch 1,
odd spatial sizes, channels past a tile's edge), strides 1 and 2, 1×1, 3×3 and 7×7 filters,
split-K; and bit for bit against v2's 128×128 tile where the reduction is summed alike.

The emulator runs wgmma through its descriptors and 128-byte swizzle, the mbarriers with their
phases, the cp.async arrive-on and the async-proxy fence as the PTX ISA defines them
(tests/kernels/emu/wgmma_emu.h): a wrong descriptor, swizzle, parity or missing fence shows here
as a wrong result or a reported error."""
import numpy
import pytest

import oracle
from emulated_device import emulated_module
from minidl.bench.kernels import resnet50_convs
from minidl.kernels import conv_v3
from minidl.kernels.autotune import Plan
from minidl.kernels.launch import Launcher
from test_emulated_conv_v2 import run_pass
from v3_shapes import SHAPES  # the GPU check runs the same shapes (gpu_cases.py)

CASES = [(tile.name, conv_pass, shape) for tile in conv_v3.TILES.values() for conv_pass, shapes in SHAPES.items()
         if tile.serves(conv_pass) for shape in shapes]


class V3Kernels:
    """The three passes with a v3 plan, over the emulator (conv_v3's kernels and its split-K sum)."""

    def __init__(self):
        self.launcher = Launcher(emulated_module, 2)

    def run(self, conv_pass, geometry, operands, out, plan):
        conv_v3.launch(self.launcher, conv_pass, conv_v3.TILES[plan.tile], plan.splits, geometry, *operands, out)
        return out

    def conv_forward(self, x, w, stride, padding, plan):
        from minidl.kernels.conv import conv_geometry
        geometry = conv_geometry(x.shape, w.shape, stride, padding)
        y = numpy.empty((*geometry[:1], *geometry[7:9], geometry[4]), dtype=x.dtype)
        return self.run("conv_fwd", geometry, (x, w), y, plan)

    def conv_grad_input(self, gy, w, x_shape, stride, padding, plan):
        from minidl.kernels.conv import conv_geometry
        return self.run("conv_dgrad", conv_geometry(x_shape, w.shape, stride, padding), (gy, w),
                        numpy.empty(x_shape, dtype=gy.dtype), plan)

    def conv_grad_weight(self, x, gy, w_shape, stride, padding, plan):
        from minidl.kernels.conv import conv_geometry
        return self.run("conv_wgrad", conv_geometry(x.shape, w_shape, stride, padding), (x, gy),
                        numpy.empty(w_shape, dtype=numpy.float32), plan)


@pytest.fixture(scope="module")
def v3(emulated):
    return V3Kernels()


def geometry_of(shape):
    n, h, w, c, k, r, stride, padding = shape
    return n, h, w, c, k, r, r, (h + 2 * padding - r) // stride + 1, (w + 2 * padding - r) // stride + 1, stride, padding


@pytest.mark.parametrize("tile, conv_pass, shape", CASES, ids=[f"{t}-{p}-{'x'.join(map(str, s))}" for t, p, s in CASES])
def test_v3_tile_against_the_reference(v3, tile, conv_pass, shape):
    assert conv_v3.TILES[tile].fits(conv_pass, conv_v3.V3Tile.dtype, geometry_of(shape)), "a case the tile serves"
    ours, reference = run_pass(v3, "bf16", conv_pass, shape, Plan("v3", tile))
    oracle.assert_close(ours, reference, oracle.TOLERANCE["bf16"], f"{tile} {conv_pass} {shape}")


@pytest.mark.parametrize("conv_pass", list(SHAPES))
def test_split_reductions_sum_in_order(v3, conv_pass):
    """Three splits of the reduction (fp32 partial tiles, then splitk_reduce): the same result."""
    shape = SHAPES[conv_pass][1]
    ours, reference = run_pass(v3, "bf16", conv_pass, shape, Plan("v3", "bf16_128x128", 3))
    oracle.assert_close(ours, reference, oracle.TOLERANCE["bf16"], f"3 splits {conv_pass}")


def test_tiles_refuse_what_they_cannot_compute():
    tile = conv_v3.TILES["bf16_128x128"]
    assert not tile.fits("conv_fwd", conv_v3.V3Tile.dtype, geometry_of((1, 5, 5, 72, 64, 3, 1, 1)))  # C % 64
    assert not tile.fits("conv_dgrad", conv_v3.V3Tile.dtype, geometry_of((1, 5, 5, 64, 72, 3, 1, 1)))  # K % 64
    assert not tile.fits("conv_wgrad", numpy.float32, geometry_of((1, 5, 5, 64, 64, 3, 1, 1)))  # no TF32
    assert not conv_v3.TILES["bf16_128x256"].serves("conv_wgrad")


@pytest.mark.parametrize("conv_pass, shape", [(p, s) for p, shapes in SHAPES.items() for s in shapes])
def test_v3_equals_v2_bit_for_bit(v3, emulated, conv_pass, shape):
    """v2's 128×128 tile sums the same k-tiles of 64 in the same order, 16 at a time per
    accumulator (mma.sync m16n8k16 there, wgmma k16 here, each exact products summed in fp32 by
    the emulator alike): the same bits."""
    theirs, _ = run_pass(emulated, "bf16", conv_pass, shape, Plan("v2", "bf16_128x128"))
    ours, _ = run_pass(v3, "bf16", conv_pass, shape, Plan("v3", "bf16_128x128"))
    assert numpy.array_equal(ours, theirs), f"{conv_pass} {shape}"


def resnet50_cases():
    """Every distinct ResNet-50 convolution a v3 tile serves, each pass, at batch 1 and 56-pixel
    images (its channels, filters and strides; the sides a quarter of 224's, which the GPU check
    runs), the tiles taken in turn so that each meets several layers."""
    cases = []
    for name, shape in resnet50_convs(1, image=56).items():
        for conv_pass in SHAPES:
            tiles = [tile.name for tile in conv_v3.TILES.values()
                     if tile.serves(conv_pass) and tile.fits(conv_pass, conv_v3.V3Tile.dtype, geometry_of(shape))]
            if tiles:
                cases.append((f"{name.split(' ')[0]}-{conv_pass}", conv_pass, shape, tiles[len(cases) % len(tiles)]))
    return cases


RESNET50_CASES = resnet50_cases()


@pytest.mark.slow  # about a minute: layer4's 512 to 2,048 channels
@pytest.mark.parametrize("name, conv_pass, shape, tile", RESNET50_CASES, ids=[f"{c[0]}-{c[3]}" for c in RESNET50_CASES])
def test_v3_on_resnet50_layer_shapes(v3, name, conv_pass, shape, tile):
    ours, reference = run_pass(v3, "bf16", conv_pass, shape, Plan("v3", tile))
    oracle.assert_close(ours, reference, oracle.TOLERANCE["bf16"], f"{name} {tile} {shape}")
