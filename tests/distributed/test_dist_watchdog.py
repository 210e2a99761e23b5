"""Faults under mpiexec: a stopped rank is named and the job ends by itself with its last checkpoint
intact and resumable; a slowed rank is named the straggler; the watchdog changes no result.

Two ranks train ResNet-20 at 16 px on a small embedded dataset with short deadlines. A rank is
stopped (SIGSTOP) at the phase a test wants without any hook in the product: the test stops it
and reads the stall warning, which says what the rank was last seen doing; where that is not the
phase, it continues the rank (SIGCONT) and tries again. For evaluation it stops the rank a
little after steps.jsonl shows the epoch's last step, in an evaluation made long enough (larger
validation images) that the rank's heartbeat has said so, however fast the machine."""
import json
import os
import random
import re
import signal
import time

import pytest

from minidl.checkpoint import CheckpointDir
from minidl.data import make_embedded_dataset
from minidl.distributed import Communicator, watchdog
from minidl.distributed.watchdog import GRACE_SECONDS
from mpi import hosts, launch
from mpi.job import Job

TIMEOUT, WARNING = 8, 3
FLAGS = ["--model", "resnet20", "-b", 8, "--train-crop-size", 16, "--val-crop-size", 16, "--val-resize-size", 16,
         "--augment", "none", "--print-freq", 1]
DEADLINES = ["--collective-timeout", TIMEOUT, "--stall-warning", WARNING]
LONG_EVAL = ["--val-resize-size", 64, "--val-crop-size", 64]  # 16 times the pixels: many heartbeats long


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_embedded_dataset(tmp_path_factory.mktemp("embedded") / "data", train_per_class=16, val_per_class=24)


@pytest.fixture
def start_job():
    """start(data, output_dir, *flags): a Job training on two ranks, killed with every rank when the
    test ends however it ends."""
    jobs = []

    def start(data, output_dir, *flags):
        jobs.append(Job(launch.start("minidl.train", 2, "--data-path", data, "--output-dir", output_dir, *FLAGS,
                                     *flags), output_dir))
        return jobs[-1]

    yield start
    for job in jobs:
        if job.process.poll() is None:
            job.kill()


def epoch_ended(job, seen):
    """A trigger: true once steps.jsonl shows a new epoch's last step (evaluation follows)."""
    ends = [s["iteration"] for s in job.steps() if float(s["epoch"]).is_integer()]
    if ends and ends[-1] not in seen:
        seen.add(ends[-1])
        return True
    return False


def stop_in(job, rank, phase, trigger=None, attempts=25):
    """Stop `rank` while it is in `phase`, as the stall warning reports it; (pid, time of the stop)."""
    pid = job.ranks()[rank]["pid"]
    job.wait_until(lambda: len(job.steps()) >= 4, 60, "four steps")
    seen = set()
    for _ in range(attempts):
        if trigger is None:
            time.sleep(random.uniform(0.05, 0.4))
        else:
            job.wait_until(lambda: trigger(job, seen), 60, "the trigger")
            time.sleep(random.uniform(0.1, 0.3))  # past a heartbeat (0.05 s ticks) into the phase
        while not job.lines.empty():
            job.lines.get()
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        line = job.line_naming(rank, pid, WARNING + 10)
        assert line is not None, f"no stall warning named rank {rank} (pid {pid})\n{job.output()}"
        if re.search(rf"stopped: no heartbeat for [\d.]+ s, last seen (waiting )?in {phase} ", line):
            return pid, stopped_at
        logged = len(job.steps())
        os.kill(pid, signal.SIGCONT)
        # A wait warns once: the next stop must come in a new one. Two more steps logged (the first
        # may be one the stopped rank 0 had not yet written) put both ranks past the warned wait.
        job.wait_until(lambda: len(job.steps()) >= logged + 2, 60, "two steps after the rank continued")
    job.kill()
    pytest.fail(f"rank {rank} was never caught in {phase} in {attempts} tries\n{job.output()}")


def assert_gone(pid):
    """MPI_Abort ended the stopped rank too."""
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"the stopped rank (pid {pid}) outlived the job")


@pytest.mark.slow
@pytest.mark.parametrize("rank, phase, every", [(1, "backward", 3), (0, "checkpoint", 1), (1, "eval", 3)])
def test_a_stopped_rank_is_named_the_job_ends_and_resumes_from_its_last_checkpoint(start_job, data, tmp_path, rank,
                                                                                   phase, every):
    extra = LONG_EVAL if phase == "eval" else []
    job = start_job(data, tmp_path, "--epochs", 40, "--checkpoint-every", every, *DEADLINES, *extra)
    host = job.ranks()[rank]["host"]
    pid, stopped_at = stop_in(job, rank, phase, trigger=epoch_ended if phase == "eval" else None)
    status = job.end(TIMEOUT + GRACE_SECONDS + 30)
    seconds = time.monotonic() - stopped_at
    err = "".join(job.err)
    assert status != 0, job.output()
    named = re.search(rf"minidl: collective timeout \(--collective-timeout {TIMEOUT}\): rank {1 - rank} has waited "
                      rf"[\d.]+ s in (\S+ ?\d*) at step (\d+); stalled: rank {rank} \(pid {pid} on {host}; stopped: "
                      rf"no heartbeat for [\d.]+ s, last seen (waiting )?in {phase} at step (\d+)\); aborting the job", err)
    assert named, job.output()
    assert seconds < TIMEOUT + 30, f"the job ended {seconds:.1f} s after the stop"
    print(f"\nrank {rank} stopped in {phase}: the job ended {seconds:.1f} s after the stop; {named[0]}")
    assert_gone(pid)

    path, _, meta = CheckpointDir(tmp_path, 3).load_latest(warn=pytest.fail)  # loads, its SHA-256 checked
    resumed = launch.run("minidl.train", 2, "--data-path", data, "--output-dir", tmp_path, *FLAGS, *DEADLINES,
                         *extra, "--checkpoint-every", every, "--epochs", meta["epoch"] + 1, "--resume", "auto",
                         timeout=120)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"resumed from {path} at epoch {meta['epoch'] + 1}, step {meta['step']}" in resumed.stdout
    epochs = [json.loads(line)["epoch"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert epochs == list(range(1, meta["epoch"] + 2))


@pytest.mark.slow
def test_a_rank_slowed_by_stops_is_named_the_straggler(start_job, data, tmp_path):
    job = start_job(data, tmp_path, "--epochs", 3)
    pid = job.ranks()[1]["pid"]
    job.wait_until(lambda: len(job.steps()) >= 2, 60, "two steps")
    logged = len(job.steps())
    try:
        while job.process.poll() is None:  # each step that starts, rank 1 is stopped for 30 ms of its compute
            steps = len(job.steps())
            if steps == logged:
                time.sleep(0.001)
                continue
            logged = steps
            time.sleep(0.002)  # past the update, which is not compute
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.03)
            os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:  # the rank has ended, the launcher not yet
        pass
    assert job.end(5) == 0, job.output()
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = metrics[-1]
    assert last["straggler"] == 1 and last["straggler_share"] > 0.5, last
    assert last["rank_compute"][1] > 1.2 * last["rank_compute"][0] and last["straggler_wait"] > 0, last
    assert "straggler: rank 1, >= 20% slower than the others' median" in "".join(job.out).splitlines()[-2]
    windows = [s for s in job.steps() if s["epoch"] > 2]
    assert sum(s["slowest_rank"] == 1 for s in windows) > len(windows) / 2
    print(f"\nslowed rank 1: {', '.join(f'{k} {last[k]}' for k in sorted(last) if 'compute' in k or 'strag' in k)}")


@pytest.mark.slow
def test_the_watchdog_changes_no_result(data, tmp_path):
    losses = []
    for name, deadlines in (("on", DEADLINES), ("off", ["--collective-timeout", 0, "--stall-warning", 0])):
        done = launch.run("minidl.train", 2, "--data-path", data, "--output-dir", tmp_path / name, *FLAGS,
                          "--epochs", 1, *deadlines, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        metrics = json.loads((tmp_path / name / "metrics.jsonl").read_text())
        losses.append((metrics["train_loss"], metrics["val_loss"]))
    assert losses[0] == losses[1]


@pytest.mark.slow
def test_without_thread_multiple_one_line_says_so_and_a_waiting_rank_answers_for_its_host(cluster):
    """MPI without MPI_THREAD_MULTIPLE (mpi4py asks for 'funneled'): no heartbeat thread may call MPI,
    so a rank answers other hosts only from inside its waits. 2 hosts × 2 ranks (tests/mpi/hosts.py):
    rank 2 is stopped; rank 0 learns from host 1's board, which rank 3 sends while it waits for
    rank 2, that rank 2 is stopped (not unreachable) and what it was doing."""
    made = cluster(2)
    data = make_embedded_dataset(made.shared / "data", train_per_class=8, val_per_class=2)
    job = Job(made.start("minidl.train", 2, "--data-path", data, "--output-dir", made.shared / "run", *FLAGS,
                         "--epochs", 40, *DEADLINES, env={"MPI4PY_RC_THREAD_LEVEL": "funneled"}), made.shared / "run")
    pid = job.ranks()[2]["pid"]
    job.wait_until(lambda: len(job.steps()) >= 4, 60, "four steps")
    os.kill(pid, signal.SIGSTOP)
    assert job.end(TIMEOUT + GRACE_SECONDS + 30) != 0, job.output()
    err = "".join(job.err)
    assert err.count("no MPI_THREAD_MULTIPLE") == 1, job.output()
    assert re.search(rf"rank 0 has waited [\d.]+ s in \S+ ?\d* at step \d+; stalled: rank 2 \(pid {pid} on "
                     rf"{hosts.host_name(1)}; stopped: no heartbeat for [\d.]+ s, last seen (waiting )?in [a-z]+ ?\d* "
                     rf"at step \d+\); aborting the job", err), job.output()


def test_one_rank_arms_nothing_and_its_waits_need_none():
    watchdog.arm(Communicator(), 600, 60, [{"rank": 0, "host": "here", "pid": os.getpid()}])
    assert not watchdog.armed()
    watchdog.doing("forward")  # a no-op
    with pytest.raises(RuntimeError):
        watchdog.wait_for(lambda: False)
