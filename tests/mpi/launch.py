"""Run a script of this folder under mpiexec from a pytest test, with a timeout.

The mpiexec next to the running Python comes first: `pip install mpich` puts it in the
virtual environment's bin/, and it must match the MPI library that mpi4py loads there. Every
rank gets one thread (MINIDL_NUM_THREADS, OPENBLAS_NUM_THREADS): eight ranks share two cores.
"""
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def mpiexec():
    beside_python = Path(sys.executable).parent / "mpiexec"
    return str(beside_python) if beside_python.exists() else shutil.which("mpiexec")


def require_mpi():
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed: pip install -e '.[test]' installs mpi4py and mpich")
    if mpiexec() is None:
        pytest.skip("no mpiexec beside this Python or on PATH: pip install mpich")


def environment(env=None):
    """This process's environment without MINIDL_ variables, one thread per rank, the CPU, and `env`."""
    variables = {k: v for k, v in os.environ.items() if not k.startswith("MINIDL_")}
    variables.update(MINIDL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                     MINIDL_DEVICE="cpu", **(env or {}))
    return variables


def command(script, ranks, *args):
    """mpiexec -n `ranks` on tests/mpi/<script>, or on module `script` when it is no .py file (python -m)."""
    target = [str(HERE / script)] if script.endswith(".py") else ["-m", script]
    return [mpiexec(), "-n", str(ranks), sys.executable, *target, *map(str, args)]


def start(script, ranks, *args, env=None):
    """Start `command`'s job in a session of its own (kill it with os.killpg); the Popen, stdout and
    stderr piped as text."""
    require_mpi()
    return subprocess.Popen(command(script, ranks, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=environment(env), start_new_session=True)


def run(script, ranks, *args, env=None, timeout=120):
    """Run `script` as `start` does and wait for it; the CompletedProcess (stdout, stderr as text).
    A run that outlives `timeout` seconds is killed, with its whole process group, and fails."""
    return finish(start(script, ranks, *args, env=env), script, timeout)


def finish(process, script, timeout):
    """Wait for a started job; the CompletedProcess, or a failure (the job killed) after `timeout` s."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(f"{script} still ran after {timeout} s\n{out}\n{err}")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def run_checks(script, ranks, *args, env=None, timeout=120):
    """Run a script built on common.Checks; fail unless every rank passed; rank 0's last line."""
    result = run(script, ranks, *args, env=env, timeout=timeout)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout.strip().splitlines()[-1]
