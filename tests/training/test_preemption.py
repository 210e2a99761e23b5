"""The stop request under repeated signals, inside a Slurm job and outside one, and the line after a
stop: its words for each cause, and the requeue (a stand-in scontrol on PATH records its calls)."""
import os
import signal
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta

import pytest

from minidl.distributed import slurm
from minidl.training import preemption
from minidl.training.preemption import StopRequest, stopped_line


@pytest.fixture
def handlers():
    """The process's signal handlers as they were, put back after the test."""
    saved = {signum: signal.getsignal(signum) for signum in preemption.SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_inside_slurm_repeats_of_the_schedulers_signals_are_ignored_and_stay_so(monkeypatch, handlers):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    with StopRequest() as stop:
        for signum in (signal.SIGTERM, signal.SIGCONT, signal.SIGTERM, signal.SIGUSR1, signal.SIGTERM):
            signal.raise_signal(signum)  # what a task sees at the time limit, and more
        assert stop.requested == "SIGTERM"
    signal.raise_signal(signal.SIGTERM)  # a late one, after the stop: still harmless
    assert stop.requested == "SIGTERM"


def test_slurms_warning_requests_a_stop(monkeypatch, handlers):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with StopRequest() as stop:
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR1)
    assert stop.requested == "SIGUSR1"
    assert signal.getsignal(signal.SIGTERM) is not stop._handle  # outside Slurm the handlers go back


def repeat_in_a_child(first, second, slurm_job):
    """Exit status and stderr of a child that gets `first`, then `second` inside a StopRequest."""
    code = textwrap.dedent(f"""
        import signal
        from minidl.training.preemption import StopRequest
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal: a job started in the
        # background of a shell (nohup ... &) inherits SIGINT ignored, and Python then leaves it so
        with StopRequest():
            signal.raise_signal(signal.{first})
            signal.raise_signal(signal.{second})
            print("survived", flush=True)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update({"SLURM_JOB_ID": "7"} if slurm_job else {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("first, second, slurm_job, survives", [
    ("SIGTERM", "SIGTERM", False, False),  # kill twice, outside Slurm: stop now
    ("SIGTERM", "SIGTERM", True, True),    # the time limit's second SIGTERM: keep stopping cleanly
    ("SIGINT", "SIGINT", False, False),    # Ctrl-C twice: stop now
    ("SIGINT", "SIGINT", True, False),     # Ctrl-C twice on srun: stop now too
    ("SIGUSR1", "SIGTERM", True, True),    # the warning, then the limit
])
def test_a_second_signal_stops_at_once_only_where_a_user_sent_it(first, second, slurm_job, survives):
    result = repeat_in_a_child(first, second, slurm_job)
    assert ("survived" in result.stdout) == survives, result.stderr
    if not survives:  # ended by the second signal itself (Python ends a KeyboardInterrupt so too)
        assert result.returncode == -getattr(signal, second), result.stderr


def test_the_cause_in_words():
    now = datetime(2026, 12, 5, 20, 0, 0)
    in_30_s = (now + timedelta(seconds=30)).isoformat()
    assert slurm.stop_cause("SIGUSR1", {"EndTime": in_30_s, "JobState": "RUNNING"}, now) == "time limit in 30 s"
    assert slurm.stop_cause("SIGTERM", {"JobState": "COMPLETING", "Reason": "TimeLimit"}) == "time limit reached"
    assert slurm.stop_cause("SIGTERM", {"JobState": "TIMEOUT"}) == "time limit reached"
    assert slurm.stop_cause("SIGTERM", {"JobState": "PREEMPTED"}) == "job preempted"
    assert slurm.stop_cause("SIGTERM", {"JobState": "RUNNING", "Reason": "None"}) == "stopped by SIGTERM"
    assert slurm.stop_cause(None, {}) == "stopped by a signal to another rank"


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """A stand-in scontrol first on PATH: `show job` prints a record with Requeue=$REQUEUE, `requeue`
    appends its argument to calls.txt."""
    script = tmp_path / "scontrol"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = show ]; then echo "JobId=$4 JobState=COMPLETING Reason=TimeLimit Requeue=$REQUEUE"; fi
        if [ "$1" = requeue ]; then echo "$2" >> {tmp_path}/calls.txt; fi
    """))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    return tmp_path / "calls.txt"


@pytest.mark.slow
def test_a_requeueable_job_is_requeued_once_and_says_so(scontrol, monkeypatch):
    monkeypatch.setenv("REQUEUE", "1")
    line = stopped_line("SIGTERM", 154, "runs/x/checkpoint.h5", "runs/x")
    assert line == "time limit reached: checkpoint at iteration 154 (runs/x/checkpoint.h5), job requeued"
    assert scontrol.read_text() == "42\n"


@pytest.mark.slow
def test_a_job_that_cannot_be_requeued_is_not_and_the_line_says_how_to_go_on(scontrol, monkeypatch):
    monkeypatch.setenv("REQUEUE", "0")
    line = stopped_line("SIGTERM", 154, "runs/x/checkpoint.h5", "runs/x")
    assert line.startswith("time limit reached: checkpoint at iteration 154 (runs/x/checkpoint.h5), not requeued: "
                           "the job is not requeueable (sbatch --requeue makes it so)")
    assert not scontrol.exists()


@pytest.mark.slow
def test_ctrl_c_inside_slurm_does_not_requeue(scontrol, monkeypatch):
    monkeypatch.setenv("REQUEUE", "1")
    assert "Resume with: python train.py --resume auto" in stopped_line("SIGINT", 3, "c.h5", "runs/x")
    assert not scontrol.exists()


def test_outside_slurm_the_line_says_how_to_resume(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert stopped_line("SIGTERM", 3, "runs/x/c.h5", "runs/x") == (
        "stopped by SIGTERM at iteration 3; checkpoint runs/x/c.h5. Resume with: python train.py --resume auto "
        "--output-dir runs/x (and the same flags)")
