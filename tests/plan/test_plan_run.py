"""A whole run: its totals against the sum of its iterations, each engine piece it is built from
shown to matter (a change to the piece changes the prediction), the machine files and their
errors, and the command line."""
import dataclasses
import json

import pytest

from minidl import schedule
from minidl.config import Config
from minidl.distributed import allreduce, costmodel, grid, reducer
from minidl.errors import UserError
from minidl.plan import __main__ as cli
from minidl.plan import machines, run
from minidl.plan.profile import Profile
from minidl.training.build import schedule_rows

DATASET = 50_000


@pytest.fixture(autouse=True)
def fresh_exchanges():
    """Exchanges are cached by their arguments: a test that changes the engine must not see old ones."""
    run.cached_exchange.cache_clear()
    yield
    run.cached_exchange.cache_clear()


def plan(world_size=16, machine="abci", batch_schedule="0:16/rank,2:32/rank", bucket_mb=0.25, names=("torus2d",)):
    config = Config(model="resnet20", train_crop_size=32, batch_schedule=batch_schedule, epochs=4,
                    bucket_mb=bucket_mb).resolved(imagenet=True)
    setup = run.Setup("resnet20", 32, machines.load(machine), world_size, bucket_mb)
    return run.simulate_run(setup, schedule_rows(config, world_size, DATASET), names)


def test_the_run_is_the_sum_of_its_iterations():
    (result,) = plan()
    assert [(e.per_gpu_batch, e.iterations) for e in result.epochs] == [(16, 195), (16, 195), (32, 97), (32, 97)]
    small, large = result.iterations[(16, 1)], result.iterations[(32, 1)]
    assert result.seconds == pytest.approx(2 * 195 * small.seconds + 2 * 97 * large.seconds)
    assert result.images == 2 * 195 * 256 + 2 * 97 * 512
    assert result.efficiency == pytest.approx((2 * 195 * small.compute_only + 2 * 97 * large.compute_only)
                                              / result.seconds)
    assert large.forward == pytest.approx(2 * small.forward) and 0 < result.efficiency < 1


def total(**changes):
    return plan(**changes)[0].seconds


@pytest.mark.parametrize("piece, target, replacement", [
    ("the batch schedule", (schedule.BatchSchedule, "global_batch"),
     lambda original: lambda self, epoch: 2 * original(self, epoch)),
    ("the reducer's buckets", (reducer, "bucket_bounds"),
     lambda original: lambda length, itemsize, bucket_mb, alignment: original(length, itemsize, 0, alignment)),
    ("the backward profile", (Profile, "final_fractions"), lambda original: lambda self: [1.0] * len(original(self))),
    ("the all-reduce's stages", (allreduce.AllReduce, "plan"),
     lambda original: lambda self, buffer, scratch=None: stages_twice(original(self, buffer, scratch))),
    ("the grid chooser", (grid, "predict"),
     lambda original: lambda ranks, per_node, buckets, shape=None, machine=costmodel.ABCI:
     original(ranks, per_node, buckets, (1, ranks), machine)),
    ("the cost model", (costmodel, "ring_phases"),
     lambda original: lambda *args, **kwargs: [dataclasses.replace(p, bandwidth=p.bandwidth / 2)
                                               for p in original(*args, **kwargs)]),
])
def test_a_change_to_each_engine_piece_changes_the_prediction(monkeypatch, piece, target, replacement):
    before = total()
    owner, name = target
    monkeypatch.setattr(owner, name, replacement(getattr(owner, name)))
    run.cached_exchange.cache_clear()
    after = total()
    assert after != pytest.approx(before, rel=1e-3), f"{piece} does not reach the prediction"


def stages_twice(plan):
    """The plan with every stage run twice."""
    plan.stages = plan.stages + plan.stages
    return plan


@pytest.mark.parametrize("name", machines.names())
def test_every_shipped_machine_loads_with_a_source_beside_every_figure(name):
    machine = machines.load(name)
    assert machine.name == name and set(machine.sources) == {*machines.FIGURES, "compute"}
    assert all(len(source) > 20 for source in machine.sources.values()), machine.sources
    links = machine.links()
    assert links.node_bandwidth == machine.network_adapters_per_node * machine.network_adapter_bandwidth
    assert links.intra_alpha == machine.intra_node_latency and links.alpha == machine.network_latency
    assert names_needed() <= set(machines.names())


def names_needed():
    return {"big_basin", "abci", "dgx_h100", "dgx_h200"}


def test_figures_are_read_in_their_units():
    abci = machines.load("abci")
    assert abci.gpus_per_node == 4 and abci.intra_node_bandwidth == 50e9
    assert abci.intra_node_latency == pytest.approx(3.4e-6) and abci.network_latency == pytest.approx(9.6e-6)
    assert abci.node_bandwidth == 2 * 100e9 / 8 and abci.memory_bandwidth == 900e9
    assert abci.compute.images_per_second == 1200 and abci.compute.batch == 256
    assert machines.load("big_basin").compute.backward_ms == 120


def broken(tmp_path, change):
    data = json.loads((machines.FOLDER / "abci.json").read_text())
    change(data)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("change, words", [
    (lambda d: d.pop("network_latency_us"), "has no network_latency_us: add"),
    (lambda d: d["network_adapter_Gbps"].update(value=0), "network_adapter_Gbps is 0, not a positive number"),
    (lambda d: d["memory_bandwidth_GBps"].update(value=-900), "memory_bandwidth_GBps is -900, not a positive"),
    (lambda d: d["intra_node_bandwidth_GBps"].update(value="fast"), "intra_node_bandwidth_GBps is 'fast'"),
    (lambda d: d["gpus_per_node"].update(value=4.5), "gpus_per_node is 4.5: it counts things"),
    (lambda d: d["gpus_per_node"].pop("source"), "gpus_per_node has no source"),
    (lambda d: d.pop("compute"), "has no compute figure"),
    (lambda d: d["compute"].update(backward_ms=100), "exactly one of images_per_second or backward_ms"),
    (lambda d: d["compute"].update(images_per_second=0), "images_per_second is 0"),
    (lambda d: d["compute"].update(model="alexnet"), "compute's model 'alexnet' is not one of"),
])
def test_a_bad_machine_file_is_one_line_naming_the_field_and_the_fix(tmp_path, change, words):
    with pytest.raises(UserError, match="machine file .*broken.json") as error:
        machines.load(broken(tmp_path, change))
    assert words in str(error.value) and "\n" not in str(error.value)


def test_an_unknown_machine_or_an_unreadable_file(tmp_path):
    with pytest.raises(UserError, match="unknown machine 'tpu': choose one of abci, big_basin"):
        machines.load("tpu")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UserError, match="cannot read the machine file"):
        machines.load(tmp_path / "bad.json")


def main(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_sony_plan_prints_its_time_to_train_and_breakdown(capsys, tmp_path):
    code, out, err = main(capsys, "--recipe", "sony", "--world-size", 2176, "--machine", "abci",
                          "--json", tmp_path / "plan.json")
    assert code == 0, err
    for words in ("on 2,176 GPUs of abci (544 nodes of 4), recipe sony: 90 epochs of 1,281,167 images",
                  "epochs 0-29: global batch 34,816 = 16 per GPU, 36 iterations an epoch",
                  "epochs 30-89: global batch 69,632 = 32 per GPU, 18 iterations an epoch",
                  "exposed communication ms", "time to train", "images/s", "scaling efficiency", "torus2d 64x34"):
        assert words in out, words
    saved = json.loads((tmp_path / "plan.json").read_text())
    runs = {r["algorithm"]: r for r in saved["runs"]}
    assert set(runs) == {"ring", "hierarchical", "torus2d 64x34"}
    torus = runs["torus2d 64x34"]
    assert torus["grid"]["shape"] == "64x34" and torus["grid"]["source"] == "cost model"
    assert torus["seconds"] == pytest.approx(sum(e["seconds"] for e in torus["epochs"]))
    assert len(torus["epochs"]) == 90 and [b["bytes"] for b in torus["buckets"]][1:] == [25 * 2**20] * 3
    it = torus["iterations"][0]
    assert it["iteration_ms"] == pytest.approx(it["forward_ms"] + it["backward_ms"] + it["exposed_communication_ms"]
                                               + it["optimizer_update_ms"] + it["data_wait_ms"])
    assert saved["machine"]["sources"]["network_latency_us"].startswith("NCCL tuning model")
    assert saved["timeline"]["algorithm"] == "torus2d 64x34" and saved["timeline"]["stages"]


def test_plot_draws_both_figures(capsys, tmp_path):
    code, out, err = main(capsys, "--model", "resnet20", "--train-crop-size", 32, "-b", 32, "--epochs", 1,
                          "--world-size", 64, "--machine", "dgx_h200", "--plot", tmp_path / "figures")
    assert code == 0, err
    for name in ("efficiency.png", "timeline.png"):
        assert (tmp_path / "figures" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, words", [
    (["--recipe", "sony2", "--world-size", 8], "invalid choice: 'sony2'"),
    (["--model", "vgg16", "--world-size", 8], "unknown model 'vgg16': choose one of"),
    (["--allreduce", "tree", "--world-size", 8], "invalid choice: 'tree'"),
    (["--recipe", "sony", "--world-size", 2002], "do not fill whole nodes of 4 on abci: use a multiple of 4"),
    (["--batch-schedule", "0:8192", "--world-size", 12], "global batch 8192 (epoch 0) does not split over 12 ranks"),
    (["--recipe", "goyal", "--world-size", 64, "--torus-shape", "3x21"], "has 63 ranks but the job has 64"),
    (["--recipe", "goyal", "--world-size", 64, "--torus-shape", "8x8", "--machine", "big_basin"], None),
    (["--recipe", "goyal", "--world-size", 64, "--torus-shape", "16x4", "--machine", "abci"], None),
    (["--recipe", "goyal", "--world-size", 48, "--torus-shape", "6x8", "--machine", "big_basin"],
     "torus shape 6x8 does not line up with nodes of 8 GPUs"),
    (["--recipe", "goyal", "--world-size", 0], "--world-size must be positive"),
    (["--recipe", "goyal", "--world-size", 8, "--machine", "cray"], "unknown machine 'cray'"),
    (["--recipe", "goyal", "--world-size", 8, "--forward-ms", 3], "--forward-ms and --backward-ms go together"),
    (["--recipe", "goyal", "--world-size", 8, "--images-per-second", 9, "--backward-ms", 3], "give one GPU's speed"),
    (["--recipe", "goyal", "--world-size", 8, "--dataset-size", 100], "larger than an epoch's 100 images"),
    (["--recipe", "goyal", "--world-size", 8, "--calibrate", "no/such.json"], "cannot read benchmark results from"),
])
def test_bad_input_is_one_line_and_exit_code_2(capsys, argv, words):
    code, out, err = main(capsys, *argv)
    if words is None:
        assert code == 0, err
        return
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("minidl-plan: error: ") and words in err, err


def test_the_calibrated_links_need_a_measured_compute(capsys, tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps([{"algorithm": "native", "bytes": n, "ranks": 2, "seconds": 1e-5 + n / 1e9,
                                  "local_size": 2} for n in (1e5, 1e6, 1e7)]))
    code, out, err = main(capsys, "--model", "resnet20", "-b", 8, "--world-size", 2, "--calibrate", bench)
    assert code == 2 and "--calibrate describes this machine's links, not its compute" in err
    code, out, err = main(capsys, "--model", "resnet20", "-b", 8, "--world-size", 2, "--calibrate", bench,
                          "--forward-ms", 10, "--backward-ms", 20, "--update-ms", 1, "--train-crop-size", 16)
    assert code == 0, err
    assert "2 GPUs of abci, links calibrated (1 node of 2)" in out and "forward ms" in out
    assert "forward 1.25 + backward 2.5 ms per image here" in out  # over the 8 images of a micro-batch
