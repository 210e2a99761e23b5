"""The Slurm job around this process: whether there is one, what scontrol says of it, and
requeueing it after a stop, so that the next allocation resumes from the checkpoint.

Details: docs/distributed.md, "minidl/distributed/slurm.py".
"""
import os
import subprocess
from datetime import datetime


def job_id():
    """This job's id (srun tasks and batch scripts have SLURM_JOB_ID), or None outside Slurm."""
    return os.environ.get("SLURM_JOB_ID") or None


def inside_slurm_job():
    return job_id() is not None


def scontrol(*args):
    """(succeeded, scontrol's output or error, one line)."""
    try:
        result = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, str(error)
    text = result.stdout if result.returncode == 0 else result.stderr or result.stdout
    return result.returncode == 0, " ".join(text.split())


def job_record(job):
    """{field: value} of `scontrol show job` (JobState, Reason, Requeue, EndTime, ...); {} where it cannot tell."""
    succeeded, text = scontrol("show", "job", "--oneliner", job)
    if not succeeded:
        return {}
    return dict(field.split("=", 1) for field in text.split() if "=" in field)


def stop_cause(signal_name, record, now=None):
    """Why Slurm stopped the run, in words: its advance warning (SIGUSR1, from sbatch --signal=USR1@SECONDS)
    says how long is left; a SIGTERM names the time limit, a preemption or a cancel where the job's record does."""
    if signal_name == "SIGUSR1" and record.get("EndTime", "").startswith("2"):
        left = datetime.fromisoformat(record["EndTime"]) - (now or datetime.now())
        return f"time limit in {max(0, round(left.total_seconds()))} s"
    if record.get("JobState") == "TIMEOUT" or record.get("Reason") == "TimeLimit":
        return "time limit reached"
    if record.get("JobState") in ("PREEMPTED", "CANCELLED"):
        return f"job {record['JobState'].lower()}"
    return f"stopped by {signal_name or 'a signal to another rank'}"


def requeue(job, record):
    """Put `job` back into the queue when it was submitted requeueable; what happened, in words."""
    if record.get("Requeue") != "1":
        return ("not requeued: the job is not requeueable (sbatch --requeue makes it so); submit the same script "
                "again to continue: its --resume auto picks up the checkpoint")
    succeeded, text = scontrol("requeue", job)
    return "job requeued" if succeeded else f"not requeued: scontrol requeue {job}: {text}"
