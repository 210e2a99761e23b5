"""The training step, eager or replayed from a CUDA graph, behind one interface.

The loop drives a step as `begin(lr)`, `micro_batch(images, labels, last)` per micro-batch,
`end(check)` (whether a non-finite loss was seen; a graph answers only when `check`, its loss
staying on the device), then `update()`. Both kinds add their images and losses into the
epoch's `totals` (EpochTotals) and charge their phases to the step timer.

Details: docs/training.md, "minidl/training/steps.py".
"""
import math

from minidl.distributed import watchdog
from minidl.training.device_step import DeviceStep
from minidl.training.forward import forward_loss
from minidl.training.graph import GraphedStep


class EagerStep:
    """Forward and backward of each micro-batch, the last one's backward overlapped with the
    gradient all-reduce (`reducer`), then the update."""

    def __init__(self, model, optimizer, reducer, timer, totals, label_smoothing):
        self.model, self.optimizer, self.reducer, self.timer = model, optimizer, reducer, timer
        self.totals, self.label_smoothing = totals, label_smoothing
        self.nonfinite = False

    def begin(self, lr):
        self.optimizer.lr = lr
        self.optimizer.zero_grad()
        # --amp: the bf16 weights as the last update left them, once per step (not per micro-batch)
        self.optimizer.flat.refresh_bf16_copy()
        self.timer.start()
        self.nonfinite = False

    def micro_batch(self, images, labels, last):
        watchdog.doing("forward")
        _, loss = forward_loss(self.model, images, labels, self.label_smoothing)
        self.timer.mark("forward")
        watchdog.doing("backward")
        self.reducer.backward(loss) if last else loss.backward()
        self.timer.mark("backward")
        value = float(loss.data)
        self.nonfinite |= not math.isfinite(value)
        self.totals.loss_sum += value * len(labels)
        self.totals.images += len(labels)

    def end(self, check):
        self.reducer.wait()
        self.timer.mark("allreduce")
        if self.reducer.active:
            self.timer.add_since("communication", self.reducer.launched_at)
        return self.nonfinite

    def update(self):
        self.optimizer.step()

    def settle(self):
        """The eager step's loss is on the host already."""


class GraphedTrainStep:
    """--cuda-graph: one micro-batch per step, the whole step (update included) replayed from
    a CUDA graph; its loss summed on the device and read at checks (`end(check=True)`) and
    before checkpoints (`settle`). The time split has no device synchronization: the data
    wait, and the whole replayed step under "forward"."""

    def __init__(self, model, optimizer, timer, totals, label_smoothing, amp, images_shape):
        self.optimizer, self.timer, self.totals = optimizer, timer, totals
        self.device_step = DeviceStep(model, optimizer, label_smoothing, amp)
        self.graphed = GraphedStep(self.device_step, optimizer, images_shape)
        self.images_shape = images_shape
        self.nonfinite_seen, self.launched = 0, False

    def begin(self, lr):
        self.optimizer.lr = lr
        self.timer.start()
        self.launched = False

    def micro_batch(self, images, labels, last):
        self.graphed(images, labels)
        self.totals.images += len(labels)
        self.launched = True
        self.timer.mark("forward")

    def end(self, check):
        if not check:
            return False
        self.settle()
        seen, self.nonfinite_seen = self.nonfinite_seen, 0
        return seen > 0

    def update(self):
        if not self.launched:  # every image was undecodable: the update still happens, from no gradient
            self.optimizer.zero_grad()
            self.optimizer.step()

    def settle(self):
        """Move the loss summed on the device into the totals (a wait for the device)."""
        loss_sum, nonfinite = self.device_step.take_totals()
        self.totals.loss_sum += loss_sum
        self.nonfinite_seen += nonfinite
