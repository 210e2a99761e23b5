"""The parts around the training step (minidl.trainer's `train_epoch`), each with its trigger.

Each step, the epoch's loop runs every part's `before_step(position)`, the step, then every
part's `after_step(position, stopping)`, in list order; `epoch_end()` when the epoch is
complete or the run stops inside it. A new part is a `Part` with the hooks it needs, added to
the trainer's list. Inside the step itself stay its watchdog activities, the one collective
deciding the non-finite loss and the stop, and the diagnostic checkpoint of a non-finite loss.

Details: docs/training.md, "minidl/training/parts.py".
"""
import time

from minidl.distributed import watchdog


def every(n, last):
    """A trigger on the epoch's steps done (from 1): after every `n`-th step and after step `last`."""
    return lambda steps_done: steps_done % n == 0 or steps_done == last


class Part:
    """A piece of the training loop; each hook does nothing unless the part defines it."""

    def before_step(self, position):
        pass

    def after_step(self, position, stopping):
        pass

    def epoch_end(self):
        pass


class WatchdogStep(Part):
    """Tells the watchdog which optimizer step this rank works on (its deadlines' messages name it)."""

    def before_step(self, position):
        watchdog.at_step(position.iteration + 1)


class TraceWindow(Part):
    """--trace-steps: tells the run's trace (minidl.training.trace) when each step starts and finishes."""

    def __init__(self, trace):
        self.trace = trace

    def before_step(self, position):
        self.trace.step_starting(position.iteration + 1)

    def after_step(self, position, stopping):
        self.trace.step_finished()


class Progress(Part):
    """The progress bar after every step; `log(bar, images_per_sec)` whenever `due(steps_done)`."""

    def __init__(self, bar, due, images_per_step, log):
        self.bar, self.due, self.images_per_step, self.log = bar, due, images_per_step, log
        self.window_start, self.window_images = time.perf_counter(), 0

    def after_step(self, position, stopping):
        self.window_images += self.images_per_step
        self.bar.update(1)
        if self.due(position.step):
            self.log(self.bar, self.window_images / (time.perf_counter() - self.window_start))
            self.window_start, self.window_images = time.perf_counter(), 0

    def epoch_end(self):
        self.bar.close()


class Checkpoints(Part):
    """--checkpoint-every: `save()` every `every` iterations inside the epoch (its end saves one anyway)
    unless the run is stopping (then the stop saves one)."""

    def __init__(self, every, steps, save):
        self.every, self.steps, self.save = every, steps, save

    def after_step(self, position, stopping):
        if (self.every and not stopping and position.iteration % self.every == 0
                and position.step < self.steps):
            self.save()
