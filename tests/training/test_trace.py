"""--trace-steps in one process: the recorder's intervals on a small model, the Chrome trace's
form and clock alignment, the window over a run (evaluation inside it, a window the run never
reaches), bad flags, and a run without tracing that makes no recorder at all."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minidl import autograd, nn, ops, trainer
from minidl.autograd import Tensor
from minidl.config import Config
from minidl.data import make_embedded_dataset
from minidl.training import chrome_trace
from minidl.training.recorder import TraceRecorder
from minidl.training.timer import StepTimer
from mpi.common import TiedNet

REPO = Path(__file__).resolve().parents[2]


def traced_step(model, recorder, timer):
    x = Tensor(np.random.default_rng(0).standard_normal((2, 6, 6, 3)).astype(np.float32))
    timer.start()
    timer.mark("data")
    loss = ops.softmax_cross_entropy(model(x), np.array([1, 3]))
    timer.mark("forward")
    loss.backward()
    timer.mark("backward")
    timer.mark("allreduce")
    timer.mark("optimizer")
    recorder.end_step(7)


def test_the_recorder_names_modules_and_nests_them_in_the_step():
    nn.manual_seed(0)
    model, timer = TiedNet(), StepTimer(lambda: None)
    recorder = TraceRecorder(model, timer)
    recorder.start()
    traced_step(model, recorder, timer)
    recorder.stop()
    assert nn.Module.call_hook is None and autograd._backward_observer is None and timer.observer is None
    intervals = recorder.collect()
    by_category = {}
    for track, name, category, start, end, args in intervals:
        assert track == chrome_trace.COMPUTE_TRACK and start <= end
        by_category.setdefault(category, []).append((name, start, end, args))
    (step_name, step_start, step_end, step_args), = by_category[chrome_trace.STEP]
    assert (step_name, step_args) == ("step 7", {"step": 7})
    assert all(step_start <= start <= end <= step_end for _, _, _, start, end, _ in intervals)
    assert [name for name, *_ in by_category[chrome_trace.PHASE]] == \
        ["data wait", "forward", "backward", "all-reduce wait", "optimizer update"]
    forward = [(name, args["output"]) for name, _, _, args in by_category[chrome_trace.FORWARD]]
    assert forward == [("conv", [2, 6, 6, 8]), ("fc", [2, 8]), ("fc", [2, 8]), ("head", [2, 5]), ("TiedNet", [2, 5])]
    backward = [(name, args["ops"]) for name, _, _, args in by_category[chrome_trace.BACKWARD]]
    assert [name for name, _ in backward] == ["(outside modules)", "head", "fc", "TiedNet", "fc", "TiedNet", "conv"]
    assert backward[5][1] == "GlobalAvgPool, ReLU"  # the Functions TiedNet.forward made itself, merged
    phase = {name: (start, end) for name, start, end, _ in by_category[chrome_trace.PHASE]}
    for name, start, end, _ in by_category[chrome_trace.BACKWARD]:
        assert phase["backward"][0] <= start <= end <= phase["backward"][1], name
    assert recorder.collect() == []


def test_the_trace_format_aligns_each_rank_by_its_offset():
    recordings = [{"rank": 0, "host": "a", "tracks": ["compute"], "intervals": [(0, "step 1", "step", 10.0, 10.5, {})]},
                  {"rank": 1, "host": "b", "tracks": ["compute", "bucket 0: x"],
                   "intervals": [(1, "allreduce (world)", "allreduce", 110.25, 110.5, {"op": "allreduce"})]}]
    trace = chrome_trace.document(recordings, [(0.0, 0.0), (100.0, 2e-6)], {"steps": [1, 1]})
    complete = {e["name"]: e for e in trace["traceEvents"] if e["ph"] == "X"}
    assert (complete["step 1"]["ts"], complete["step 1"]["dur"]) == (0.0, 500000.0)
    assert (complete["allreduce (world)"]["ts"], complete["allreduce (world)"]["pid"]) == (250000.0, 1)
    names = {(e["pid"], e["tid"], e["name"]): e["args"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names[(1, 0, "process_name")] == {"name": "rank 1 (b)"}
    assert names[(1, 1, "thread_name")] == {"name": "bucket 0: x"}
    assert trace["otherData"]["clock_alignment"]["uncertainty_us"] == [0.0, 2.0]
    assert trace["displayTimeUnit"] == "ms"


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    return make_embedded_dataset(tmp_path_factory.mktemp("embedded") / "data", train_per_class=8, val_per_class=2)


def small_config(data, output_dir, **overrides):
    """5 steps of 16 images per epoch."""
    settings = dict(data_path=str(data), model="resnet20", batch_size=16, epochs=2, train_crop_size=16,
                    val_crop_size=16, val_resize_size=16, augment="none", output_dir=str(output_dir))
    return Config(**{**settings, **overrides})


def test_a_window_across_an_epoch_records_the_evaluation(small_data, tmp_path):
    trainer.run(small_config(small_data, tmp_path, trace_steps="5:6"))
    events = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
    top = [e["name"] for e in events if e["cat"] in (chrome_trace.STEP, chrome_trace.EVALUATION)]
    assert top == ["step 5", "evaluation", "step 6"]
    evaluation = next(e for e in events if e["name"] == "evaluation")
    assert not [e for e in events if e["cat"] == chrome_trace.FORWARD and within(e, evaluation)]


def within(inner, outer):
    return outer["ts"] <= inner["ts"] <= outer["ts"] + outer["dur"]


def test_a_window_the_run_never_reaches_writes_nothing_and_says_so(small_data, tmp_path, capsys):
    trainer.run(small_config(small_data, tmp_path, trace_steps="50:60", epochs=1))
    assert "--trace-steps 50:60 traced nothing: the run's steps ended at 5" in capsys.readouterr().out
    assert not (tmp_path / "trace.json").exists()


def test_without_trace_steps_there_is_no_recorder(small_data, tmp_path, monkeypatch):
    def no_trace(*args):
        raise AssertionError("a run without --trace-steps made a RunTrace")
    monkeypatch.setattr(trainer, "RunTrace", no_trace)
    trainer.run(small_config(small_data, tmp_path, epochs=1))
    assert not (tmp_path / "trace.json").exists()
    assert nn.Module.call_hook is None and autograd._backward_observer is None and autograd._scope is None


@pytest.mark.parametrize("args, expected", [
    (["--trace-steps", "5:3"], "--trace-steps '5:3' is not A:B with 1 <= A <= B"),
    (["--trace-steps", "0:2"], "--trace-steps '0:2' is not A:B"),
    (["--trace-steps", "three"], "write e.g. 3:5"),
    (["--trace", "t.json"], "--trace t.json needs --trace-steps A:B"),
])
@pytest.mark.slow
def test_bad_trace_flags_give_one_line_and_exit_2(args, expected, tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
