"""Where a training step's time goes: data wait, forward, backward, all-reduce, optimizer.

`StepTimer.mark(phase)` charges the time since the previous mark to `phase`. On a GPU each
mark first waits for the device, so the split is of device time as well (the price: the host
cannot run ahead of the GPU across a mark). `report()` gives the seconds per step of each
phase averaged since the previous report, for the progress bar and `steps.jsonl`.
"""
import time

PHASES = ("data", "forward", "backward", "allreduce", "optimizer")


class StepTimer:
    def __init__(self, synchronize):
        self.synchronize = synchronize
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.steps = 0
        self.last = None

    def start(self):
        self.synchronize()
        self.last = time.perf_counter()

    def mark(self, phase):
        self.synchronize()
        now = time.perf_counter()
        self.totals[phase] += now - self.last
        self.last = now

    def end_step(self):
        self.steps += 1

    def report(self):
        """{phase: seconds per step} since the last report (and start a new window)."""
        split = {phase: total / max(self.steps, 1) for phase, total in self.totals.items()}
        self.totals = dict.fromkeys(PHASES, 0.0)
        self.steps = 0
        return split
