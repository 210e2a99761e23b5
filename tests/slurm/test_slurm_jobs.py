"""Training under a real Slurm (tests/slurm/cluster.py: one node, this machine): the job script of the
docs at the time limit (a checkpoint, the job requeued, the next allocation resuming it bit for bit
like an uninterrupted run), scancel --signal=TERM, and a user error reported once for the job."""
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minidl.checkpoint import load_checkpoint
from minidl.data import make_embedded_dataset
from mpi.launch import environment, require_mpi
from slurm.cluster import KILL_WAIT
from training.test_resume import assert_same_run, command

pytestmark = pytest.mark.slow  # every test starts Slurm's daemons and trains in jobs

REPO = Path(__file__).resolve().parents[2]
JOB_SCRIPT = REPO / "docs" / "slurm.sbatch"
# The lines of the job script that size it for a cluster; the tests give their own on sbatch's command line
SIZING = ("--nodes", "--ntasks-per-node", "--gpus-per-node", "--time", "--signal", "--output")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """30 steps of 16 images per epoch: a stop at a random moment lands inside an epoch"""
    return make_embedded_dataset(tmp_path_factory.mktemp("embedded") / "data", train_per_class=48, val_per_class=4)


def training_flags(data, output_dir, epochs):
    """train.py's flags for 2 ranks: those of tests/training/test_resume.py's runs."""
    argv = command(data, output_dir, "--print-freq", 5, ranks=2, epochs=epochs)
    return argv[argv.index(str(REPO / "train.py")) + 1:]


def scaled_job_script(folder, first_allocation_delay):
    """docs/slurm.sbatch without its sizing lines: the same srun line, requeue and output mode; the
    first allocation waits `first_allocation_delay` seconds before its srun."""
    lines = [line for line in JOB_SCRIPT.read_text().splitlines()
             if not (line.startswith("#SBATCH") and line.split()[1].split("=")[0] in SIZING)]
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun --mpi=pmi2 --kill-on-bad-exit=1 "))
    lines.insert(srun, f'[ "${{SLURM_RESTART_COUNT:-0}}" -gt 0 ] || sleep {first_allocation_delay}')
    path = folder / "job.sbatch"
    path.write_text("\n".join(lines) + "\n")
    return path


def job_environment(slurm):
    """The cluster's, with this Python's bin first on PATH and one thread per rank (sbatch passes it on)."""
    env = environment({"SLURM_CONF": slurm.env["SLURM_CONF"]})
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    return env


def wait_for_job(slurm, job, condition, seconds, output):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        record = slurm.job(job)
        if condition(record):
            return record
        time.sleep(0.5)
    pytest.fail(f"job {job} is {record.get('JobState')} after {seconds} s\n{read(output)}\n{slurm.logs()}")


def read(path):
    return path.read_text(errors="replace") if path.exists() else "(no output)"


def controller_times(slurm, pattern):
    """The times (s) of slurmctld's log lines that match `pattern`."""
    stamps = re.findall(r"^\[([0-9T:.-]+)\] " + pattern, (slurm.root / "log" / "slurmctld.log").read_text(), re.M)
    return [time.mktime(time.strptime(stamp.split(".")[0], "%Y-%m-%dT%H:%M:%S")) + float("0." + stamp.split(".")[1])
            for stamp in stamps]


@pytest.mark.timeout(1500)  # on a loaded machine both runs train at a third of their idle pace
def test_time_limit_checkpoints_requeues_and_the_next_allocation_resumes_exactly(slurm, data, tmp_path):
    require_mpi()
    chain, reference = tmp_path / "chain", tmp_path / "reference"
    # The first allocation meets its limit 60 to 90 s after it starts (slurmctld looks every 30 s).
    # Its srun starts 40 s in, so it trains for 20 to 50 s of the 900 iterations: 625 at most
    # alone on an idle 2-core machine (12.5 iterations/s: 600 took 48 s here, 72 s on CI's).
    # Once requeued, the job gets 10 minutes: the rest ends in the next allocation, or a few more
    # on a machine so loaded that it does not.
    flags = training_flags(data, chain, epochs=30)
    output = tmp_path / "job.out"
    script = scaled_job_script(tmp_path, first_allocation_delay=40)
    job = slurm.run("sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--time=1", f"--output={output}",
                    f"--chdir={REPO}", str(script), *flags, env=job_environment(slurm)).stdout
    job = job.strip().split(";")[0]
    log = tmp_path / "uninterrupted.log"
    with open(log, "w") as sink:
        uninterrupted = subprocess.Popen(command(data, reference, "--print-freq", 5, ranks=2, epochs=30),
                                         stdout=sink, stderr=subprocess.STDOUT, env=environment())
    ended = ("COMPLETED", "FAILED")
    first = wait_for_job(slurm, job, lambda r: r.get("JobState") in ended or (
        r.get("Restarts", "0") != "0" and r.get("JobState") in ("PENDING", "RUNNING")), 600, output)
    if first["JobState"] not in ended:
        slurm.run("scontrol", "update", f"JobId={job}", "TimeLimit=10")
    assert uninterrupted.wait(timeout=1200) == 0, read(log)[-2000:]
    record = wait_for_job(slurm, job, lambda r: r.get("JobState") in ended, 1200, output)
    assert record["JobState"] == "COMPLETED", read(output)
    out = read(output)
    stops = re.findall(r"minidl: time limit reached: checkpoint at iteration (\d+) \((.*)\), job requeued", out)
    assert stops, out
    resumed = re.findall(r"minidl: resumed from (.*) at epoch (\d+), step (\d+), iteration (\d+)", out)
    assert [(path, int(i)) for i, path in stops] == [(path, int(i)) for path, _, _, i in resumed], out
    assert "Traceback" not in out and "died without finishing" not in out, out
    limits = controller_times(slurm, f"Time limit exhausted for JobId={job}")
    requeues = controller_times(slurm, f"Requeuing JobId={job}")
    assert len(limits) == len(requeues) == len(stops), slurm.logs()
    ended = [requeued - limit for limit, requeued in zip(limits, requeues)]
    print(f"{len(stops)} stops at the limit, at iterations {[int(i) for i, _ in stops]}; the job's tasks had ended "
          f"{', '.join(f'{seconds:.1f}' for seconds in ended)} s after each limit (KillWait {KILL_WAIT} s)")
    assert max(ended) < KILL_WAIT
    assert slurm.job(job)["Restarts"] == str(len(stops))
    assert_same_run(chain, reference)


def test_scancel_signal_term_stops_checkpoints_and_requeues_once(slurm, data, tmp_path):
    require_mpi()
    output, run_dir = tmp_path / "job.out", tmp_path / "run"
    flags = training_flags(data, run_dir, epochs=9)
    job = slurm.run("sbatch", "--parsable", "--ntasks=2", "--requeue", "--open-mode=append", f"--output={output}",
                    f"--chdir={REPO}", "--wrap", " ".join(["srun --mpi=pmi2 python -m mpi4py train.py", *flags]),
                    env=job_environment(slurm)).stdout.strip().split(";")[0]
    steps = run_dir / "steps.jsonl"
    wait_for_job(slurm, job, lambda r: steps.exists() and len(steps.read_text().splitlines()) >= 2, 120, output)
    slurm.run("scancel", "--signal=TERM", job)
    wait_for_job(slurm, job, lambda r: r.get("Restarts") == "1", 60, output)
    slurm.run("scancel", job)  # the next allocation is the time-limit test's
    out = read(output)
    stops = re.findall(r"minidl: stopped by SIGTERM: checkpoint at iteration (\d+) \((.*)\), job requeued", out)
    assert len(stops) == 1, out
    assert load_checkpoint(stops[0][1])[1]["iteration"] == int(stops[0][0])
    assert "Traceback" not in out and "died without finishing" not in out, out


@pytest.mark.parametrize("launch, words", [
    (["--mpi=none", "python", "-m", "mpi4py", "train.py"], "srun started 2 tasks but MPI sees each alone"),
    (["--mpi=pmi2", "python", "-m", "mpi4py", "train.py", "--epochs", "0"], "--epochs"),
], ids=["plain srun", "bad flag"])
def test_a_mistake_every_task_finds_is_one_line_for_the_job(slurm, launch, words):
    require_mpi()
    result = slurm.run("srun", "--ntasks=2", f"--chdir={REPO}", *launch, check=False, env=job_environment(slurm),
                       timeout=120)
    errors = [line for line in result.stderr.splitlines() if "train.py: error:" in line]
    assert len(errors) == 1 and words in errors[0], result.stderr
