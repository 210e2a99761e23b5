"""One training step that never waits for the device: what --cuda-graph captures
(minidl.training.graph), and what the step benchmark runs with --amp or --cuda-graph.

`DeviceStep(...)(images, labels)` zeroes the gradients, runs forward, backward and the
optimizer's update, one process only. The loss sum and the count of non-finite losses stay
on the device; `take_totals()`, when the caller chooses, is the only synchronization.

Details: docs/training.md, "minidl/training/device_step.py".
"""
import numpy

from minidl import amp as amp_policy
from minidl.backend import xp
from minidl.training.forward import forward_loss


class DeviceStep:
    def __init__(self, model, optimizer, label_smoothing=0.0, amp=False):
        self.model, self.optimizer, self.label_smoothing = model, optimizer, label_smoothing
        if amp:
            amp_policy.enable(model, optimizer)
        self.loss_sum = xp.zeros((), dtype=numpy.float64)
        self.nonfinite = xp.zeros((), dtype=numpy.int32)

    def __call__(self, images, labels, staged=False):
        """One step on a uint8 NHWC batch and its int64 labels, both on the device."""
        self.optimizer.zero_grad()
        self.optimizer.flat.refresh_bf16_copy()
        _, loss = forward_loss(self.model, images, labels, self.label_smoothing)
        loss.backward()  # one process: its gradient is the global one, nothing to all-reduce
        if staged:
            self.optimizer.step_from_device()
        else:
            self.optimizer.step()
        self.loss_sum += loss.data.astype(numpy.float64) * len(labels)
        self.nonfinite += ~xp.isfinite(loss.data)

    def take_totals(self):
        """(Σ loss × batch size, how many losses were not finite) since the last call; waits for the device."""
        totals = float(self.loss_sum), int(self.nonfinite)
        self.loss_sum.fill(0)
        self.nonfinite.fill(0)
        return totals
