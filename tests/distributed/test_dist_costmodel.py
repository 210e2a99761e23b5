"""The alpha–beta cost model against closed forms, the torus grid it chooses, and the all-reduce
benchmark end to end."""
import json
from dataclasses import replace

import pytest

from minidl.bench import allreduce as bench
from minidl.distributed import costmodel, grid
from minidl.errors import UserError
from mpi.launch import run, run_checks

N = 100e6
ABCI = costmodel.ABCI


@pytest.mark.parametrize("x, y", [(4, 272), (32, 34), (48, 72), (1, 8), (8, 1)])
def test_torus_steps_and_bytes(x, y):
    phases = costmodel.torus(ABCI, x, y, N)
    assert costmodel.steps(phases) == 2 * (x - 1) + 2 * (y - 1)
    # the same bytes per rank as a ring over all x·y ranks
    assert costmodel.bytes_sent(phases) == pytest.approx(2 * (x * y - 1) / (x * y) * N)


def test_ring_and_halving_doubling_steps():
    assert costmodel.steps(costmodel.ring(ABCI, 1088, N)) == 2 * 1087
    assert costmodel.steps(costmodel.halving_doubling(ABCI, 1024, N)) == 2 * 10
    assert costmodel.steps(costmodel.halving_doubling(ABCI, 1088, N)) == 2 * 10 + 2
    assert costmodel.bytes_sent(costmodel.halving_doubling(ABCI, 1024, N)) == pytest.approx(2 * 1023 / 1024 * N)


def test_times_are_alpha_beta_sums():
    machine = costmodel.Machine(gpus_per_node=8, alpha=1e-5, intra_bandwidth=1e9, node_bandwidth=4e9)
    # one node: 2(p−1) steps of n/p bytes over NVLink
    assert costmodel.seconds(costmodel.ring(machine, 8, N), machine) == pytest.approx(14 * (1e-5 + N / 8 / 1e9))
    # 4x4 torus on 8-GPU nodes: rows inside a node; each column has 2 ranks per node, so
    # 4 columns share a node's network: 4e9 · 2 / 8 = 1e9 per column
    rows = 2 * 3 * (1e-5 + N / 4 / 1e9)
    columns = 2 * 3 * (1e-5 + N / 16 / 1e9)
    assert costmodel.seconds(costmodel.torus(machine, 4, 4, N), machine) == pytest.approx(rows + columns)


def test_calibration_recovers_alpha_and_bandwidth():
    truth = costmodel.Machine(gpus_per_node=8, alpha=3e-5, intra_bandwidth=2e9)
    measured = [(n, costmodel.seconds(costmodel.ring(truth, 8, n), truth)) for n in (1e6, 1e7, 1e8)]
    fitted = costmodel.calibrate(measured, 8)
    assert fitted.alpha == pytest.approx(3e-5) and fitted.intra_bandwidth == pytest.approx(2e9)


def test_sony_grids():
    assert costmodel.sony_grids(1088, 4) == [(4, 272), (32, 34)]
    assert costmodel.sony_grids(3456, 4) == [(4, 864), (48, 72)]


def test_model_mode_prints_the_three_cluster_sizes(capsys):
    assert bench.main(["--model"]) == 0
    out = capsys.readouterr().out
    for ranks, ring_steps in ((1088, 2174), (2176, 4350), (3456, 6910)):
        assert f"ring 2(XY−1) = {ring_steps}" in out and f"\n{ranks:>6}  torus2d" in out
    assert "torus 2(X−1)+2(Y−1) = 548 (4x272), 128 (32x34)" in out
    assert "a run's default grid, 25 MiB buckets: 32x34" in out and "one bucket: 64x17" in out


@pytest.mark.slow
def test_benchmark_under_mpiexec_then_calibration(tmp_path, capsys):
    path = tmp_path / "bench.json"
    result = run("minidl.bench", 4, "allreduce", "--sizes-mb", "0.1,1", "--repeat", "2",
                 "--json", path, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = json.loads(path.read_text())
    names = [row["algorithm"] for row in rows]
    assert names == ["native", "ring", "hierarchical", "torus2d 2x2"] * 2
    assert all(row["ranks"] == 4 and row["seconds"] > 0 and row["vs_native"] > 0 for row in rows)
    assert "torus2d 2x2" in result.stdout
    assert bench.main(["--model", "--calibrate", str(path)]) == 0
    assert "calibrated on" in capsys.readouterr().out


def aligned_fastest(ranks, per_node, buckets):
    """The least predicted time over every grid of `ranks` whose rows line up with the nodes."""
    machine = replace(ABCI, gpus_per_node=per_node)
    grids = [(x, ranks // x) for x in range(1, ranks + 1)
             if ranks % x == 0 and (per_node % x == 0 or x % per_node == 0)]
    return min(sum(costmodel.seconds(costmodel.torus(machine, x, y, n), machine) for n in buckets) for x, y in grids)


@pytest.mark.parametrize("ranks, per_node", [(2, 2), (4, 4), (8, 2), (8, 4), (8, 8), (6, 3), (16, 4), (64, 8),
                                             (1088, 4), (2176, 4), (3456, 4)])
@pytest.mark.parametrize("buckets", [[costmodel.RESNET50_GRADIENT_BYTES], [25 * 2**20] * 4, [1.1e6]])
def test_the_default_grid_is_the_cost_models_fastest(ranks, per_node, buckets):
    choice = grid.predict(ranks, per_node, buckets)
    shape, seconds = choice.predicted["chosen"]
    assert shape == choice.shape and choice.source == "cost model"
    assert seconds == pytest.approx(aligned_fastest(ranks, per_node, buckets), rel=1e-9)
    assert seconds <= min(s for _, s in choice.predicted.values()) * (1 + 1e-9)


def test_grid_choices_at_the_sony_sizes_and_ties():
    resnet50 = [costmodel.RESNET50_GRADIENT_BYTES]
    in_buckets = grid.bucket_sizes(costmodel.RESNET50_GRADIENT_BYTES, 25)
    assert len(in_buckets) == 4 and sum(in_buckets) == costmodel.RESNET50_GRADIENT_BYTES
    assert [grid.predict(n, 4, resnet50).shape for n in (1088, 2176, 3456)] == [(64, 17), (68, 32), (72, 48)]
    assert [grid.predict(n, 4, in_buckets).shape for n in (1088, 2176, 3456)] == [(32, 34), (64, 34), (64, 54)]
    # equal times: fewer latency steps first, then the larger X
    assert grid.predict(2, 2, resnet50).shape == (2, 1)
    assert grid.predict(8, 8, resnet50).shape == (4, 2)


def test_a_given_grid_overrides_the_model():
    choice = grid.predict(8, 4, [1e6], shape=(1, 8))
    assert choice.shape == (1, 8) and choice.source == "--torus-shape"
    assert "torus2d grid 1x8 (from --torus-shape for 8 ranks, 4 per node on 2 nodes)" in choice.describe()
    with pytest.raises(UserError, match="has 6 ranks but the job has 8"):
        grid.predict(8, 4, [1e6], shape=(2, 3))


@pytest.mark.slow
def test_the_layout_comes_from_the_node_communicator():
    assert run_checks("check_grid.py", 8, timeout=90).startswith("8 ranks passed")
    assert run_checks("check_grid.py", 4, env={"MINIDL_RANKS_PER_NODE": "2"}, timeout=90).startswith("4 ranks passed")


def test_every_allreduce_flag_has_its_cost_model_entry():
    """of_algorithm covers every --allreduce name; a p2p algorithm costs its native one's rounds,
    2(N−1) for the ring and 2(X−1)+2(Y−1) for the torus (counted by the mpiexec test in the code)."""
    from minidl.distributed import ALGORITHMS
    for name in ALGORITHMS:
        assert costmodel.seconds(costmodel.of_algorithm(name, costmodel.ABCI, 16, 1e8, (4, 4)), costmodel.ABCI) > 0
    assert costmodel.of_algorithm("ring-p2p", costmodel.ABCI, 16, 1e8) == costmodel.ring(costmodel.ABCI, 16, 1e8)
    assert costmodel.steps(costmodel.of_algorithm("ring-p2p", costmodel.ABCI, 16, 1e8)) == 2 * 15
    assert costmodel.steps(costmodel.of_algorithm("torus2d-p2p", costmodel.ABCI, 24, 1e8, (4, 6))) == 2 * 3 + 2 * 5
    with pytest.raises(ValueError, match="no all-reduce"):
        costmodel.of_algorithm("butterfly", costmodel.ABCI, 4, 1e6)
