"""Preemption: SIGTERM or SIGINT asks the training loop to stop after the current step.

Cluster schedulers send SIGTERM (Slurm, Kubernetes) some seconds before they kill a job; Ctrl-C
sends SIGINT. Either sets a flag instead of interrupting, so the step in flight completes, the
loop writes a checkpoint and exits cleanly. A second signal of the same kind while stopping
interrupts at once (the usual escape hatch when saving hangs).
"""
import signal
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """A context in which SIGTERM/SIGINT set `requested` (the signal's name) instead of killing."""

    def __init__(self):
        self.requested = None
        self._previous = {}

    def _handle(self, signum, frame):
        if self.requested is not None:  # the second time: stop now
            signal.signal(signum, self._previous[signum])
            signal.raise_signal(signum)
        self.requested = signal.Signals(signum).name

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # handlers live in the main thread
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
