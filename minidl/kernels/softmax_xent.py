"""Launcher of kernels/softmax_xent.cu: softmax cross-entropy with label smoothing, forward
and backward in one pass, one block per row; float32 only."""
import numpy

from minidl.backend import get_array_module
from minidl.kernels.launch import Launcher, require_float32

FAMILY = "softmax_xent"
THREADS = 256
DEFINES = {"XENT_THREADS": THREADS}
NAMES = ("softmax_xent",)


class SoftmaxXentKernels(Launcher):
    def softmax_cross_entropy(self, logits, labels, smoothing):
        """(mean loss as a 0-d array, d loss / d logits) for integer labels."""
        require_float32(logits)
        xp = get_array_module(logits)
        n, k = logits.shape
        labels = xp.ascontiguousarray(labels, dtype=numpy.int64)
        row_loss, grad = xp.empty(n, dtype=numpy.float32), xp.empty_like(logits)
        self.launch(FAMILY, "softmax_xent", (n,), (THREADS,),
                    (logits, labels, numpy.int32(k), numpy.float32(smoothing), numpy.float32(1.0 / n), row_loss, grad))
        return row_loss.mean(), grad
