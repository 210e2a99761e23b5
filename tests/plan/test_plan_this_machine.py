"""The simulator against a real run on this machine: the cost model calibrated on `python -m
minidl.bench allreduce` and the run's own measured compute predict the exposed communication of
traced 2- and 4-rank runs (docs/plan.md, "Against this machine", gives the figures and why the
tolerance is what it is)."""
import json
import statistics

import pytest

from minidl.data import make_embedded_dataset
from minidl.plan import __main__ as plan
from minidl.training import chrome_trace
from mpi.launch import run

pytestmark = pytest.mark.slow  # benchmarks and trains under mpiexec

# the watchdog off: its waits nap up to 1 ms between tests once they pass 10 ms, which the
# alpha-beta model does not describe (docs/plan.md)
FLAGS = ["--model", "resnet20", "-b", 8, "--epochs", 1, "--train-crop-size", 16, "--val-crop-size", 16,
         "--val-resize-size", 16, "--augment", "none", "--trace-steps", "2:10", "--collective-timeout", 0,
         "--stall-warning", 0]
TOLERANCE = 4.0  # the least-disturbed step's exposed time within a factor of 4 of the prediction, either way
ATTEMPTS = 3


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_embedded_dataset(tmp_path_factory.mktemp("embedded") / "data", train_per_class=32, val_per_class=2)


def steps_of(trace):
    """Per traced step, per rank: {phase name: (start µs, duration µs)}."""
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    steps = {}
    for step in (e for e in events if e["cat"] == chrome_trace.STEP):
        end = step["ts"] + step["dur"]
        phases = {e["name"]: (e["ts"], e["dur"]) for e in events if e["pid"] == step["pid"]
                  and e["cat"] == chrome_trace.PHASE and step["ts"] <= e["ts"] <= end}
        steps.setdefault(step["args"]["step"], {})[step["pid"]] = phases
    return steps


def last_rank_waits(steps):
    """Per step, the all-reduce wait of the rank whose backward ended last: the others waited for it,
    it waited for the exchange alone (its skew is not in it)."""
    waits = []
    for ranks in steps.values():
        last = max(ranks.values(), key=lambda phases: sum(phases["backward"]))
        waits.append(last["all-reduce wait"][1] / 1e3)
    return waits


def median_ms(steps, phase):
    return statistics.median(phases[phase][1] / 1e3 for ranks in steps.values() for phases in ranks.values())


def predicted_and_measured(ranks, data, folder, capsys):
    """Calibrate on the benchmark, run the traced training, plan it: (predicted exposed ms, the last
    rank's waits in ms, a line saying what was measured)."""
    bench = folder / "bench.json"
    result = run("minidl.bench", ranks, "allreduce", "--sizes-mb", "0.25,0.5,1,2", "--repeat", 10, "--json", bench,
                 timeout=120)
    assert result.returncode == 0, result.stderr
    result = run("minidl.train", ranks, "--data-path", data, "--output-dir", folder / "run", *FLAGS, timeout=180)
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    steps = steps_of(json.loads((folder / "run" / "trace.json").read_text()))
    grid = json.loads((folder / "run" / "config.json").read_text())["torus_grid"]["shape"]
    forward, backward = median_ms(steps, "forward"), median_ms(steps, "backward")
    code = plan.main(["--model", "resnet20", "--train-crop-size", "16", "-b", "8", "--epochs", "1",
                      "--dataset-size", "320", "--world-size", str(ranks), "--calibrate", str(bench),
                      "--forward-ms", str(forward), "--backward-ms", str(backward), "--torus-shape", grid,
                      "--json", str(folder / "plan.json")])
    assert code == 0, capsys.readouterr().err
    planned = json.loads((folder / "plan.json").read_text())
    torus = next(r for r in planned["runs"] if r["algorithm"] == f"torus2d {grid}")
    predicted, waits = torus["iterations"][0]["exposed_communication_ms"], last_rank_waits(steps)
    assert len(waits) == 9 and predicted > 0
    return predicted, waits, (f"predicted {predicted:.3f} ms, least {min(waits):.3f} ms, median "
                              f"{statistics.median(waits):.3f} ms (forward {forward:.1f}, backward {backward:.1f} ms)")


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_exposed_communication_of_a_traced_run(ranks, data, tmp_path, capsys):
    """A benchmark and a run taken while the machine's load changed in between say nothing of the
    model: up to ATTEMPTS pairs are measured, and one must agree."""
    seen = []
    for attempt in range(ATTEMPTS):
        predicted, waits, line = predicted_and_measured(ranks, data, tmp_path / str(attempt), capsys)
        seen.append(line)
        if predicted / TOLERANCE <= min(waits) <= predicted * TOLERANCE:
            return
    pytest.fail(f"{ranks} ranks, no pair within a factor {TOLERANCE:g}: " + "; ".join(seen))
