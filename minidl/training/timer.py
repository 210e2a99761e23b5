"""Where a training step's time goes: data wait, forward, backward, all-reduce, optimizer.

`StepTimer.mark(phase)` charges the time since the previous mark to `phase`. On a GPU each
mark first waits for the device, so the split is of device time as well (the price: the host
cannot run ahead of the GPU across a mark). `report()` gives the seconds per step of each
phase averaged since the previous report, for the progress bar and `steps.jsonl`;
`epoch_report()` the same since the previous epoch report, for the epoch's line.

The "allreduce" phase is the wait for the gradient reduction after backward has returned: the
communication the step was exposed to. `add_since("communication", start)` charges the time
from `start` to the last mark to a quantity that is no phase (it overlaps them): the whole
communication, from the first bucket's launch to the reduction's end; the reports then carry
it too. `this_step` holds the current step's seconds per phase. An `observer` (None by
default) hears of `started()` and each `marked(phase)`.
"""
import time

PHASES = ("data", "forward", "backward", "allreduce", "optimizer")


class Sums:
    """Seconds per quantity and the steps they were summed over."""

    def __init__(self):
        self.seconds, self.steps = dict.fromkeys(PHASES, 0.0), 0

    def per_step(self):
        return {name: total / max(self.steps, 1) for name, total in self.seconds.items()}


class StepTimer:
    def __init__(self, synchronize):
        self.synchronize = synchronize
        self.recent, self.epoch = Sums(), Sums()
        self.last = None
        self.this_step = {}
        self.observer = None

    def start(self):
        self.synchronize()
        self.last = time.perf_counter()
        self.this_step = dict.fromkeys(PHASES, 0.0)
        if self.observer is not None:
            self.observer.started()

    def mark(self, phase):
        self.synchronize()
        now = time.perf_counter()
        self._add(phase, now - self.last)
        self.this_step[phase] = self.this_step.get(phase, 0.0) + now - self.last
        self.last = now
        if self.observer is not None:
            self.observer.marked(phase)

    def add_since(self, name, start):
        self._add(name, self.last - start)

    def _add(self, name, seconds):
        for sums in (self.recent, self.epoch):
            sums.seconds[name] = sums.seconds.get(name, 0.0) + seconds

    def end_step(self):
        self.recent.steps += 1
        self.epoch.steps += 1

    def report(self):
        """{phase (and other quantity): seconds per step} since the last report (and start a new window)."""
        report, self.recent = self.recent.per_step(), Sums()
        return report

    def epoch_report(self):
        """The same since the last epoch report."""
        report, self.epoch = self.epoch.per_step(), Sums()
        return report
