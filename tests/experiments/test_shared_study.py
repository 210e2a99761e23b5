"""Several processes on one study: a run folder's claim (a lock its trainer holds), run_all leaving
the runs another process trains for last, the store read again before each addition, and two
real study processes sharing an output folder and store, each run trained once."""
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from minidl.experiments.large_batch import study
from minidl.experiments.large_batch.runs import Busy, claimed
from minidl.experiments.large_batch.store import Store
from tests.experiments.test_experiments import tiny

HOLD = "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); " \
       "sys.stdin.read()"


def test_a_claim_held_by_another_process_is_busy_until_that_process_ends(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir / "claim")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(Busy):
            with claimed(run_dir):
                pytest.fail("entered a claim another process holds")
    finally:
        holder.communicate("", timeout=30)  # stdin closed: the holder exits and its lock goes with it
    with claimed(run_dir):
        with pytest.raises(Busy):  # a second claim of this process's own, on another open file
            with claimed(run_dir):
                pass
    with claimed(run_dir):  # released on leaving
        pass


def test_run_all_takes_the_runs_another_process_trains_last(monkeypatch):
    busy_left = {("b64", 1): 2}  # busy twice, then found finished
    order = []

    def run_once(row, seed, *args):
        if busy_left.get((row, seed)):
            busy_left[row, seed] -= 1
            raise Busy(row)
        order.append((row, seed))
        return {"cached": True}

    monkeypatch.setattr(study, "run_once", run_once)
    monkeypatch.setattr(study, "BUSY_POLL_SECONDS", 0)
    bar = SimpleNamespace(update=lambda n: None, write=print)
    results = {}
    pairs = [("b32", 0), ("b64", 1), ("b32", 1), ("b64", 0)]
    study.run_all(pairs, None, None, None, results, bar)
    assert order == [("b32", 0), ("b32", 1), ("b64", 0), ("b64", 1)] and set(results) == set(pairs)


def test_refresh_reads_what_another_process_appended_but_not_a_line_it_is_still_writing(tmp_path):
    record = {"row": "b32-gradual", "seed": 0, "kernel": "k", "settings": {}, "val_error": 2.5}
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(record) + "\n")
    store = Store(path)
    with open(path, "a") as other:
        other.write(json.dumps(dict(record, seed=1)) + "\n" + json.dumps(dict(record, seed=2))[:20])
    store.refresh()
    assert [r["seed"] for r in store.records] == [0, 1]


@pytest.mark.slow  # two study processes of 6 tiny runs each, side by side
def test_two_study_processes_share_the_runs_each_trained_once(tmp_path):
    store = tmp_path / "runs.jsonl"
    argv = [sys.executable, "-m", "minidl.experiments.large_batch",
            *tiny(tmp_path, "--parts", "1", "--store", str(store))]
    processes = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    outputs = [process.communicate(timeout=600) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], [err[-2000:] for _, err in outputs]
    logs = sorted((tmp_path / "out" / "runs").glob("*/train.log"))
    assert len(logs) == 6  # k·n = 32 and 64, seeds 0-2
    assert all(log.read_text().count("minidl: training ") == 1 for log in logs)
    records = Store(store).records
    assert sorted((r["row"], r["seed"]) for r in records) == sorted({(r["row"], r["seed"]) for r in records})
    assert len(records) == 6
    trained_here = [sum(": val error " in line for line in (out + err).replace("\r", "\n").splitlines()) for out, err in outputs]
    assert sum(trained_here) == 6, trained_here  # every run once, by one process or the other
