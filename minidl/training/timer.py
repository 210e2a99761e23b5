"""Where a training step's time goes: data wait, forward, backward, all-reduce, optimizer.

`StepTimer.mark(phase)` charges the time since the previous mark to `phase` (on a GPU after
waiting for the device, so the split is of device time too); `report()` and `epoch_report()`
average the seconds per step of each phase for steps.jsonl and the epoch's line. The whole
communication, overlapping the phases, is charged apart by `add_since("communication", ...)`.

Details: docs/training.md, "minidl/training/timer.py".
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
