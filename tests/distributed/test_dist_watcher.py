"""The watcher of a rank (minidl/distributed/watcher.py) under a scheduler's stop: it ignores the
SIGTERM a scheduler sends every process of a step, and a rank whose watcher is gone anyway (a kill
of the whole job) exits without a traceback. No MPI: one process pretends to be rank 0 of 2."""
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # child processes

RANK = textwrap.dedent("""
    import os, signal, sys, time
    from minidl.distributed import watcher
    watcher.watch(0, 2)
    children = open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()
    os.kill(int(children[0]), getattr(signal, sys.argv[1]))
    time.sleep(0.5)  # the signal delivered (a killed watcher's pipe closes)
""")


def rank_whose_watcher_gets(signal_name):
    return subprocess.run([sys.executable, "-c", RANK, signal_name], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT", "SIGUSR1"])
def test_the_watcher_ignores_a_schedulers_stop_and_the_rank_exits_quietly(signal_name):
    result = rank_whose_watcher_gets(signal_name)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_a_rank_whose_watcher_was_killed_exits_without_a_traceback():
    result = rank_whose_watcher_gets("SIGKILL")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
