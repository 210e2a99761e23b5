"""--trace-steps under mpiexec: 2 and 4 ranks train a few steps of ResNet-20 and write one Chrome
trace; it is read back and checked event by event, the overlap of communication with backward
is found in it, and `python -m minidl.plot` draws its timeline. The runs' torus grid is the
cost model's choice, or --torus-shape's."""
import json
from pathlib import Path

import pytest

from minidl import plot
from minidl.data import make_embedded_dataset
from minidl.distributed import costmodel, grid
from minidl.training import chrome_trace
from mpi.launch import run

pytestmark = pytest.mark.slow  # every test trains under mpiexec

EPS = 1e-3  # µs: the rounding of ts and dur in the file
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FLAGS = ["--model", "resnet20", "-b", 4, "--epochs", 1, "--train-crop-size", 16, "--val-crop-size", 16,
         "--val-resize-size", 16, "--augment", "none", "--print-freq", 1]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_embedded_dataset(tmp_path_factory.mktemp("embedded") / "data", train_per_class=8, val_per_class=2)


def train(data, output_dir, ranks, *flags):
    result = run("minidl.train", ranks, "--data-path", data, "--output-dir", output_dir, *FLAGS, *flags, timeout=120)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def complete_events(trace):
    events = trace["traceEvents"]
    for event in events:
        assert event["ph"] in ("X", "M") and isinstance(event["pid"], int) and isinstance(event["tid"], int), event
        if event["ph"] == "X":
            assert isinstance(event["name"], str) and event["cat"] and isinstance(event["args"], dict), event
            assert event["ts"] >= 0 and event["dur"] >= 0, event
    return [event for event in events if event["ph"] == "X"]


def within(inner, outer):
    return outer["ts"] - EPS <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + EPS


def check_trace(path, ranks, steps, stage_ops):
    """The trace at `path` of `ranks` ranks and `steps` (first, last), whose buckets are reduced
    in stages `stage_ops`: well formed, complete, nested, ordered, overlapped."""
    trace = json.loads(Path(path).read_text())
    events = complete_events(trace)
    names = {(e["pid"], e["name"]) for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {(rank, kind) for rank in range(ranks) for kind in ("process_name", "thread_name")} <= names
    assert trace["otherData"]["steps"] == list(steps)
    assert len(trace["otherData"]["clock_alignment"]["offset_us"]) == ranks
    overlapped = set()
    for rank in range(ranks):
        mine = [e for e in events if e["pid"] == rank]
        step_events = [e for e in mine if e["cat"] == chrome_trace.STEP]
        assert [e["args"]["step"] for e in step_events] == list(range(steps[0], steps[1] + 1))
        for step in step_events:
            inside = [e for e in mine if e is not step and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
            assert all(within(e, step) for e in inside), f"rank {rank}: an event of {step['name']} leaves it"
            phases = [e["name"] for e in inside if e["cat"] == chrome_trace.PHASE]
            assert phases == ["data wait", "forward", "backward", "all-reduce wait", "optimizer update"], phases
            forward = {e["name"]: e["args"]["output"] for e in inside if e["cat"] == chrome_trace.FORWARD}
            assert forward["layer1.0.conv1"] == [4, 16, 16, 16] and forward["fc"] == [4, 10]
            assert "layer3.2.conv2" in {e["name"] for e in inside if e["cat"] == chrome_trace.BACKWARD}
            backward_end = next(e["ts"] + e["dur"] for e in inside if e["name"] == "backward")
            buckets = [e for e in inside if e["cat"] == chrome_trace.BUCKET]
            assert len(buckets) > 1 and len({e["tid"] for e in buckets}) == len(buckets)
            for bucket in buckets:
                stages = sorted((e for e in inside if e["cat"] == chrome_trace.STAGE and e["tid"] == bucket["tid"]),
                                key=lambda e: e["ts"])
                assert [s["args"]["op"] for s in stages] == stage_ops
                assert all(within(s, bucket) for s in stages)
                assert all(a["ts"] + a["dur"] <= b["ts"] + EPS for a, b in zip(stages, stages[1:])), "stage order"
                if stages[0]["ts"] < backward_end:
                    overlapped.add(rank)
    assert overlapped == set(range(ranks)), "every rank started some stage before its backward ended"
    return trace


def test_four_ranks_trace_overlap_plot_and_grid(data, tmp_path):
    result = train(data, tmp_path, 4, "--trace-steps", "2:3", "--bucket-mb", 0.2)
    check_trace(tmp_path / "trace.json", 4, (2, 3), ["reduce_scatter", "allreduce", "allgather"])
    assert "trace of steps 2-3 on 4 ranks" in result.stdout
    assert plot.main([str(tmp_path)]) == 0
    assert (tmp_path / "timeline.png").read_bytes()[:8] == PNG_SIGNATURE
    chosen = json.loads((tmp_path / "config.json").read_text())["torus_grid"]
    assert chosen["source"] == "cost model" and chosen["ranks_per_node"] == 4
    machine = costmodel.Machine(gpus_per_node=4)
    times = {f"{x}x{y}": sum(costmodel.seconds(costmodel.torus(machine, x, y, n), machine)
                             for n in chosen["bucket_bytes"]) for x, y in grid.aligned_grids(4, 4)}
    assert chosen["shape"] == min(times, key=times.get) == "2x2"
    metrics = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert 0 < metrics["allreduce_seconds"] <= metrics["communication_seconds"]


def test_two_ranks_with_a_given_grid(data, tmp_path):
    result = train(data, tmp_path, 2, "--trace-steps", "1:2", "--bucket-mb", 0.2, "--torus-shape", "1x2",
                   "--trace", tmp_path / "elsewhere" / "t.json")
    trace = check_trace(tmp_path / "elsewhere" / "t.json", 2, (1, 2), ["allreduce"])
    stages = [e for e in trace["traceEvents"] if e.get("cat") == chrome_trace.STAGE]
    assert {(e["args"]["group"], e["args"]["ranks"], e["args"]["algorithm"]) for e in stages} == \
        {("column", 2, "torus2d 1x2")}
    assert json.loads((tmp_path / "config.json").read_text())["torus_grid"]["shape"] == "1x2"
    assert "torus2d grid 1x2 (from --torus-shape" in result.stdout
    step = json.loads((tmp_path / "steps.jsonl").read_text().splitlines()[-1])
    assert 0 <= step["allreduce"] <= step["communication"]
