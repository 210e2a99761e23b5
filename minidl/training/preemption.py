"""Preemption: SIGTERM (schedulers), SIGUSR1 (Slurm's warning, sbatch --signal=USR1@SECONDS) or
SIGINT (Ctrl-C) asks the training loop to stop after the current step instead of killing it.

Every rank stops after the same step, rank 0 writes a checkpoint and, inside a Slurm job stopped
by the scheduler, requeues it. A repeated SIGINT stops at once (Ctrl-C twice); a repeated SIGTERM
too, but only outside Slurm (inside, the time limit sends it twice); SIGUSR1 never.

Details: docs/training.md, "minidl/training/preemption.py".
"""
import signal
import threading

from minidl.distributed import slurm

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class StopRequest:
    """A context in which SIGTERM/SIGUSR1/SIGINT set `requested` (the first signal's name) instead of killing."""

    def __init__(self):
        self.requested = None
        self._previous = {}
        self._slurm = slurm.inside_slurm_job()

    def _handle(self, signum, frame):
        if self.requested is None:
            self.requested = signal.Signals(signum).name
        elif signum == signal.SIGINT or (signum == signal.SIGTERM and not self._slurm):  # stop now
            signal.signal(signum, self._previous[signum])
            signal.raise_signal(signum)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # handlers live in the main thread
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        if self.requested and self._slurm:
            return  # the handlers stay (the module's docstring says why)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


def stopped_line(signal_name, iteration, path, output_dir):
    """Rank 0's one line after a stop. Inside a Slurm job stopped by the scheduler (anything but
    Ctrl-C), it first requeues the job: the next allocation's --resume auto continues."""
    job = slurm.job_id()
    if job is None or signal_name == "SIGINT":
        return (f"stopped by {signal_name or 'a signal to another rank'} at iteration {iteration}; checkpoint {path}. "
                f"Resume with: python train.py --resume auto --output-dir {output_dir} (and the same flags)")
    record = slurm.job_record(job)
    return f"{slurm.stop_cause(signal_name, record)}: checkpoint at iteration {iteration} ({path}), " \
           f"{slurm.requeue(job, record)}"
