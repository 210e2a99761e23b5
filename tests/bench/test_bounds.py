"""The H200 bounds (python -m minidl.bench bounds) against cases computed here by hand: resident
tiles per SM, the grad-input phases, a memory-bound and a wave-quantized layer, split-K's
traffic; v3's tiles as its launcher declares them; the blocks it counts against the v2 and v3
launchers' grids on every ResNet-50 layer; the command's table and JSON."""
import json

import pytest

from minidl.bench import bounds
from minidl.bench.__main__ import main as bench_main
from minidl.bench._nvcc import find_nvcc
from minidl.bench.kernels import resnet50_convs
from minidl.kernels import conv_v2
from minidl.kernels.conv import LATER_VERSIONS, conv_geometry

H200 = bounds.H200
V2 = {t.name: t for t in bounds.v2_tiles({(name, p): 240 for name in conv_v2.TILES for p in bounds.PASSES})}
V3 = {t.name: t for t in bounds.v3_tiles()}
TILES = {"v2": V2, "v3": V3}


def geometry(n, h, w, c, k, r, stride, pad):
    return conv_geometry((n, h, w, c), (k, r, r, c), stride, pad)


def test_tiles_per_sm():
    tile = V2["bf16_128x128"]  # 96 KiB, 128 threads of 240 registers
    assert tile.smem_bytes == 3 * 256 * 64 * 2 and tile.block_registers("conv_fwd") == 128 * 240
    assert bounds.tiles_per_sm(H200, tile, 128 * 240) == (2, "smem, registers")  # 228 // 97 KiB, 65536 // 30720
    assert bounds.tiles_per_sm(H200, V2["bf16_128x256"], 256 * 120) == (1, "smem")  # 193 KiB of 228
    small = bounds.Tile("t", "test", 64, 64, 32, 2, 256, 40 << 10, "bf16_128x128")
    assert bounds.tiles_per_sm(H200, small, 256 * 128) == (2, "registers")  # smem would allow 5 (41 KiB each)
    assert bounds.tiles_per_sm(H200, small, None) == (5, "smem")
    edge = bounds.Tile("t", "test", 64, 64, 32, 2, 256, 114 << 10, "bf16_128x128")
    assert bounds.tiles_per_sm(H200, edge, None) == (1, "smem")  # two need 2·(114 + 1 reserved) KiB of 228
    too_big = bounds.Tile("t", "test", 256, 256, 64, 4, 256, 256 << 10, "bf16_128x128")
    assert bounds.tiles_per_sm(H200, too_big, None)[0] == 0  # over the 227 KiB a block may have


def test_v3_tiles():
    """conv_v3's 128×256 tile: a producer and two consumer warpgroups, 4 stages of (128 + 256)·64
    bf16 and their 8 mbarriers of 8 bytes; 48 registers for the producer, 224 per consumer thread."""
    tile = V3["bf16_128x256"]
    assert (tile.family, tile.bm, tile.bn, tile.bk, tile.threads) == ("v3", 128, 256, 64, 384)
    assert tile.smem_bytes == 4 * (128 + 256) * 64 * 2 + 8 * 8
    assert tile.block_registers("conv_wgrad") == 128 * (48 + 2 * 224)
    assert bounds.tiles_per_sm(H200, tile, tile.block_registers("conv_fwd")) == (1, "smem, registers")
    assert bounds.tiles_per_sm(H200, V3["bf16_128x128"], 128 * (48 + 2 * 224)) == (1, "smem, registers")


def test_grad_input_phases():
    # 3×3, stride 2, padding 1 on 56²: phase (ph, pw) takes filter rows r ≡ ph + 1 (mod 2): 1 or 2 of them
    rows = 256 * 28 * 28
    assert bounds.gemm_phases("conv_dgrad", geometry(256, 56, 56, 128, 128, 3, 2, 1)) == \
        [(rows, 128, 1 * 1 * 128), (rows, 128, 1 * 2 * 128), (rows, 128, 2 * 1 * 128), (rows, 128, 2 * 2 * 128)]
    # 1×1, stride 2: only the even pixels receive a gradient; odd rows and columns take no tap
    assert [red for _, _, red in bounds.gemm_phases("conv_dgrad", geometry(2, 7, 7, 64, 32, 1, 2, 0))] == [32, 0, 0, 0]
    # odd sizes: the phases' pixels 4×4, 4×3, 3×4, 3×3
    assert [r for r, _, _ in bounds.gemm_phases("conv_dgrad", geometry(2, 7, 7, 64, 32, 1, 2, 0))] == \
        [2 * 16, 2 * 12, 2 * 12, 2 * 9]


def test_memory_bound_layer_by_hand():
    """layer1.0.conv1 (1×1, 64 → 64 on 56², batch 256), forward, bf16 128×128: 6272 blocks of 128
    pixels, two per SM: 24 waves of 264; half of each tile's 128 columns is padding over K = 64."""
    row = bounds.bound(H200, V2["bf16_128x128"], "conv_fwd", geometry(256, 56, 56, 64, 64, 1, 1, 0), 1)
    pixels = 256 * 56 * 56
    assert (row["blocks"], row["tiles_per_sm"]) == (6272, 2)
    assert row["quantization"] == pytest.approx(6272 / (24 * 264))
    assert row["padded_gflop"] == pytest.approx(2 * pixels * 128 * 64 / 1e9)
    assert row["tensor_us"] == pytest.approx(2 * pixels * 128 * 64 / 989.5e12 / (6272 / 6336) * 1e6)
    moved = (pixels * 64 + 64 * 64 + pixels * 64) * 2  # x and w read, y written, bf16
    assert row["hbm_us"] == pytest.approx(moved / 4.8e12 * 1e6)
    assert row["binds"] == "HBM" and row["bound_us"] == row["hbm_us"]
    assert row["of_peak"] == pytest.approx(2 * pixels * 64 * 64 / 989.5e12 / (moved / 4.8e12))


def test_wave_quantized_layer_by_hand():
    """layer4's 3×3 (512 → 512 on 7², batch 256), forward, bf16 128×256, one per SM: 98 × 2 = 196
    blocks on 132 SMs, two waves of which the second is half empty."""
    row = bounds.bound(H200, V2["bf16_128x256"], "conv_fwd", geometry(256, 7, 7, 512, 512, 3, 1, 1), 1)
    assert (row["blocks"], row["waves"]) == (196, pytest.approx(196 / 132))
    assert row["quantization"] == pytest.approx(196 / 264)
    flop = 2 * 12544 * 512 * 4608  # no padding: 12544 = 98·128, 512 = 2·256, 4608 = 72·64
    assert row["padded_gflop"] == row["useful_gflop"] == pytest.approx(flop / 1e9)
    assert row["tensor_us"] == pytest.approx(flop / 989.5e12 / (196 / 264) * 1e6)
    assert row["binds"] == "tensor" and row["of_peak"] == pytest.approx(196 / 264)


def test_split_k_traffic():
    g = geometry(256, 56, 56, 64, 64, 1, 1, 0)
    operands = 2 * 256 * 56 * 56 * 64 * 2
    assert bounds.hbm_bytes("conv_wgrad", g, 1) == operands + 64 * 64 * 4  # dw in fp32
    assert bounds.hbm_bytes("conv_wgrad", g, 262) == operands + 64 * 64 * 4 + 2 * 262 * 64 * 64 * 4


def test_operand_bandwidth():
    # (128 + 256)·64 bf16 per k-step of 2·128·256·64 FLOP at 989.5 TFLOP/s
    assert bounds.operand_bandwidth(H200, V2["bf16_128x256"]) == pytest.approx(989.5e12 * 384 * 2 / (2 * 128 * 256))


@pytest.mark.parametrize("batch", [256, 32])
def test_blocks_are_the_launchers(batch):
    """The blocks the bound counts are those of the v2 and v3 launchers' grids, for every layer,
    pass, tile and split they offer."""
    checked = {"v2": 0, "v3": 0}
    for shape in resnet50_convs(batch).values():
        g = geometry(*shape)
        for conv_pass in bounds.PASSES:
            for (family, name), splits in bounds.offered_splits(H200, conv_pass, g).items():
                for s in splits:
                    grid = LATER_VERSIONS[family].TILES[name].grid(conv_pass, g, s)
                    row = bounds.bound(H200, TILES[family][name], conv_pass, g, s)
                    assert row["blocks"] == grid[0] * grid[1] * grid[2], (family, name, conv_pass, shape, s)
                    checked[family] += 1
    assert checked["v2"] > 150 and checked["v3"] > 80, checked


def test_every_layer_has_a_row_per_family():
    rows = bounds.all_rows(H200, list(V2.values()) + list(V3.values()), 256)
    best = bounds.best_per_family(rows)
    layers = resnet50_convs(256)
    assert len(best) == 3 * len(layers) - 1  # the stem's grad-input is never computed
    for (layer, _), entry in best.items():
        assert set(entry) == ({"useful_gflop"} if layer.startswith("conv1") else {"useful_gflop", "v2", "v3"})
    n, h, w, c, k, r, stride, pad = layers["layer1.0.conv1 1x1"]
    assert best[("layer1.0.conv1 1x1", "fwd")]["useful_gflop"] == pytest.approx(2 * n * h * w * c * k / 1e9)


def test_command(tmp_path, capsys):
    out = tmp_path / "bounds.json"
    assert bench_main(["bounds", "--no-nvcc", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Bounds, not measurements: NVIDIA H200 SXM, 989.5 TFLOP/s dense bf16, 4.8 TB/s HBM")
    assert "| layer4.1.conv2 3x3/1 (x2) | wgrad |" in text and "| bf16_128x256 | v3 | 384 |" in text
    report = json.loads(out.read_text())
    assert report["batch_size"] == 256 and {r["family"] for r in report["rows"]} == {"v2", "v3", None}
    assert bench_main(["bounds", "--batch-size", "0"]) == 2


@pytest.mark.slow
def test_registers_from_ptxas():
    if find_nvcc() is None:
        pytest.skip("nvcc not found (PATH, $CUDA_PATH/bin, /usr/local/cuda/bin)")
    registers = bounds.ptxas_registers()
    bf16 = [t.name for t in conv_v2.TILES.values() if t.dtype.itemsize == 2]
    assert set(registers) == {(t, p) for t in bf16 for p in bounds.PASSES}
    assert all(128 < r <= 255 for r in registers.values()), registers  # 64×64 warp tiles of fp32 accumulators
