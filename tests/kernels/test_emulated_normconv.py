"""The convolutions fused with batch norm on the CPU emulator (normconv_checks.py says what each
check compares): every plan of every fused pass on shapes that divide no tile (odd spatial
sizes, channels past a tile's edge), statistics groups whose rows straddle the blocks' tiles
(ghost batch norm of 1 and 2 images), strides 1 and 2, 1×1 and 3×3 filters; the batch norms'
own steps; the plans a fused pass may take."""
import numpy
import pytest

import normconv_checks as checks
import oracle
from minidl.kernels import conv_v2
from minidl.kernels.autotune import Plan
from minidl.kernels.batchnorm import NORM, NORM_FIELDS
from minidl.kernels.conv_v2 import NORMALIZE, STATS, Fusion

# (mode, n, h, w, c, k, r, stride, padding, images per group)
CASES = [("bf16", 4, 7, 5, 64, 72, 3, 1, 1, 2),   # 98 rows a group: every block holds part of one
         ("bf16", 4, 7, 6, 72, 64, 3, 2, 1, 1),   # grad-input over 4 phases, groups of one image
         ("bf16", 2, 6, 5, 64, 128, 1, 2, 0, 2),  # a 1×1 projection, one group
         ("bf16", 2, 23, 23, 16, 64, 3, 2, 1, 1),  # phases of 12×12 and 11×11: a block of no rows
         ("tf32", 2, 5, 7, 32, 36, 3, 1, 1, 1),
         ("tf32", 2, 5, 7, 36, 32, 3, 2, 1, 1)]
IDS = ["x".join(map(str, case)) for case in CASES]
BF16 = [(case, i) for case, i in zip(CASES, IDS) if case[0] == "bf16"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_normalized_with_statistics(emulated, case):
    checks.check_forward(emulated, numpy, *case)


@pytest.mark.slow
def test_forward_statistics_alone_and_an_evaluation_norm(emulated):
    """STATS alone (the chain's first convolution); NORMALIZE alone with one group of all the
    images (evaluation: the running statistics' norm)."""
    checks.check_forward(emulated, numpy, *CASES[0], normalize=False)
    n = CASES[0][1]
    checks.check_forward(emulated, numpy, *CASES[0][:-1], n, stats=False)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.slow
def test_grad_input_through_the_batch_norm(emulated, case):
    checks.check_grad_input(emulated, numpy, *case)


@pytest.mark.parametrize("case", [c for c, _ in BF16], ids=[i for _, i in BF16])
def test_grad_weight_of_the_normalized_input(emulated, case):
    assert any(p.startswith("v2") for p in checks.check_grad_weight(emulated, numpy, *case)["plans"])


def test_split_grad_weight_and_the_table_limit(emulated):
    """A normalizing grad-weight may split its reduction (the normalization is per k-tile); its
    table of every group's scale and shift must fit NORM_TABLE_BYTES, else only v1 serves."""
    checks.check_grad_weight(emulated, numpy, *CASES[0], plans=[Plan("v2", "bf16_128x128", 3)])
    tile = conv_v2.TILES["bf16_128x256"]
    fitting = conv_v2.NORM_TABLE_BYTES // (2 * 2 * tile.bn)  # groups of one image whose table just fits
    geometry = (fitting, 7, 5, 64, 72, 3, 3, 7, 5, 1, 1)
    assert tile.fits_fusion("conv_wgrad", Fusion(NORMALIZE, None, None, 1), geometry)
    assert not tile.fits_fusion("conv_wgrad", Fusion(NORMALIZE, None, None, 1), (fitting + 1, *geometry[1:]))


@pytest.mark.parametrize("case", [("bf16", 32, 7, 7, 16, 16, 3, 1, 1, 2), ("bf16", 32, 14, 14, 16, 16, 3, 2, 1, 2)],
                         ids=["7x7", "14x14-stride2"])
@pytest.mark.slow
def test_grad_weight_whose_table_fills_the_allocation(emulated, case):
    """32 images in groups of 2 on the 256-wide tile: the table of 16 groups fills
    NORM_TABLE_BYTES, which ends the block's shared memory, and 32·7·7 pixels end mid-tile. A
    pixel past the last must not read a group past the table (the emulator reports any shared
    access outside the allocation, as the GPU faults)."""
    tile = conv_v2.TILES["bf16_128x256"]
    assert 2 * (case[1] // case[-1]) * tile.bn * 2 == conv_v2.NORM_TABLE_BYTES
    assert tile.shared_bytes(Fusion(NORMALIZE, None, None, 2)) == tile.pipeline_bytes + conv_v2.NORM_TABLE_BYTES
    checks.check_grad_weight(emulated, numpy, *case, plans=[Plan("v2", "bf16_128x256", 1), Plan("v2", "bf16_128x256", 2)])


def test_a_fused_epilogue_takes_the_whole_reduction(emulated):
    case = checks.Case(numpy, *CASES[0])
    fusion = Fusion(NORMALIZE | STATS, case.norm, None, case.images)
    assert all(p.splits == 1 for p in case.plans(emulated, "conv_fwd", fusion, (case.x, case.w))[1:])
    with pytest.raises(ValueError, match="whole reduction"):
        emulated.conv_forward_fused(case.x, case.w, case.stride, case.padding, norm=case.norm, images=case.images,
                                    stats=True, plan=Plan("v2", "bf16_128x128", 2))


@pytest.mark.parametrize("projection", [False, True], ids=["identity", "projection"])
def test_norm_add_relu_and_its_backward(emulated, projection):
    checks.check_add_relu(emulated, numpy, "bf16", 4, 5, 3, 24, 2, projection)


def test_affine_updates_the_running_statistics_group_after_group(emulated):
    rng = numpy.random.default_rng(3)
    groups, channels, rows = 3, 40, 98
    stats = numpy.stack([rng.normal(0, 1, (groups, channels)), rng.uniform(0.5, 2, (groups, channels))],
                        axis=1).astype(numpy.float32)
    gamma = rng.uniform(0.5, 1.5, channels).astype(numpy.float32)
    beta = rng.normal(0, 0.5, channels).astype(numpy.float32)
    running = [rng.normal(0, 0.2, channels).astype(numpy.float32), rng.uniform(0.5, 2, channels).astype(numpy.float32)]
    expected_running = [r.astype(numpy.float64) for r in running]
    for g in range(groups):  # GhostBatchNorm's order: each group in turn
        expected_running[0] = (1 - checks.MOMENTUM) * expected_running[0] + checks.MOMENTUM * stats[g, 0]
        expected_running[1] = ((1 - checks.MOMENTUM) * expected_running[1]
                               + checks.MOMENTUM * stats[g, 1] * rows / (rows - 1))
    norm = emulated.batch_norm_affine(stats, gamma, beta, *running, checks.MOMENTUM, checks.EPS, rows)
    inv_std = 1 / numpy.sqrt(stats[:, 1].astype(numpy.float64) + checks.EPS)
    oracle.assert_close(norm[:, NORM["inv_std"]], inv_std, 1e-6, "1/std")
    oracle.assert_close(norm[:, NORM["scale"]], gamma * inv_std, 1e-6, "scale")
    oracle.assert_close(norm[:, NORM["shift"]], beta - stats[:, 0] * gamma * inv_std, 1e-6, "shift")
    numpy.testing.assert_array_equal(norm[:, NORM["mean"]], stats[:, 0])
    for ours, reference in zip(running, expected_running):
        oracle.assert_close(ours, reference, 1e-6, "running statistics")
    evaluation = emulated.batch_norm_affine(stats[:0], gamma, beta, *running, checks.MOMENTUM, checks.EPS, rows)
    assert evaluation.shape == (1, len(NORM_FIELDS), channels)
    oracle.assert_close(evaluation[0, NORM["scale"]], gamma / numpy.sqrt(running[1].astype(numpy.float64) + checks.EPS),
                        1e-6, "evaluation scale")
