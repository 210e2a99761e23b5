"""One training step that never waits for the device: what --cuda-graph captures (minidl.graph),
and what the step benchmark runs with --amp or --cuda-graph.

`DeviceStep(model, optimizer, label_smoothing, amp)(images, labels)` zeroes the gradients,
normalizes the uint8 batch, runs the forward pass (in bf16 with `amp`, after refreshing the
bf16 copy of the weights that the previous update changed), the softmax cross-entropy,
backward and the optimizer's update; one process only (a multi-rank all-reduce is not
captured). The loss is added, times the batch size, to a sum ON THE DEVICE, and a non-finite loss
to a count there: nothing is read back. `take_totals()` reads and resets both, when the caller
chooses (every --print-freq steps): the only synchronization.
"""
import numpy

from minidl import kernels, ops
from minidl.autograd import Tensor
from minidl.backend import autocast, xp
from minidl.data.transforms import normalize


class DeviceStep:
    def __init__(self, model, optimizer, label_smoothing=0.0, amp=False):
        self.model, self.optimizer, self.label_smoothing = model, optimizer, label_smoothing
        self.amp = amp
        self.shadow = kernels.device().bf16_shadow(optimizer.flat.data) if amp else None
        self.loss_sum = xp.zeros((), dtype=numpy.float64)
        self.nonfinite = xp.zeros((), dtype=numpy.int32)

    def __call__(self, images, labels):
        """One step on a uint8 NHWC batch and its int64 labels, both on the device."""
        self.optimizer.zero_grad()
        x = normalize(images, xp)
        if self.shadow is not None:
            self.shadow.refresh()
        with autocast(self.amp):
            logits = self.model(Tensor(x))
        loss = ops.softmax_cross_entropy(logits, labels, self.label_smoothing)
        loss.backward()  # one process: its gradient is the global one, nothing to all-reduce
        self.optimizer.step()
        self.loss_sum += loss.data.astype(numpy.float64) * len(labels)
        self.nonfinite += ~xp.isfinite(loss.data)

    def take_totals(self):
        """(Σ loss × batch size, how many losses were not finite) since the last call; waits for the device."""
        totals = float(self.loss_sum), int(self.nonfinite)
        self.loss_sum.fill(0)
        self.nonfinite.fill(0)
        return totals
