"""Evaluation on the validation set, over every rank.

Batch-norm statistics stay per rank during training (Goyal et al.); before each evaluation
the ranks average their running statistics, so every rank evaluates the same model. Each rank
evaluates its share of the validation set (every image once, minidl.data.DistributedSampler
with pad=False) and the sums go through one all-reduce.
"""
import contextlib

import numpy

from minidl import kernels
from minidl.autograd import no_grad
from minidl.backend import to_numpy
from minidl.distributed import watchdog
from minidl.errors import UserError
from minidl.training.forward import forward_loss


def count_correct(logits, labels, k):
    """How many rows have their label among the k largest logits."""
    k = min(k, logits.shape[1])
    top = numpy.argpartition(-logits, k - 1, axis=1)[:, :k]
    return int((top == labels[:, None]).any(axis=1).sum())


def deciding_alone():
    """The kernel tuner decides alone inside: the ranks' evaluation batches differ (the sampler
    pads nothing), so a decision over the ranks would be met a different number of times."""
    tuner = getattr(kernels.active(), "tuner", None)
    return contextlib.nullcontext() if tuner is None else tuner.alone()


class Evaluator:
    def __init__(self, model, optimizer, loader, comm, label_smoothing):
        self.model, self.optimizer, self.loader, self.comm = model, optimizer, loader, comm
        self.label_smoothing = label_smoothing

    def average_bn_statistics(self):
        """Make every rank's BN running statistics their mean over ranks."""
        if self.comm.size > 1:
            for _, buffer in self.model.named_buffers():
                self.comm.allreduce(buffer)
                buffer /= self.comm.size

    def __call__(self):
        """{val_loss, val_top1, val_top5, val_skipped} over all ranks (collective)."""
        watchdog.doing("eval")
        self.average_bn_statistics()
        self.optimizer.flat.refresh_bf16_copy()  # --amp: once per evaluation, not per batch
        self.model.eval()
        loss_sum, top1, top5, count = 0.0, 0, 0, 0
        with no_grad(), deciding_alone():
            for images, labels in self.loader:
                if len(labels) == 0:
                    continue
                logits, loss = forward_loss(self.model, images, labels, self.label_smoothing)
                host_logits = to_numpy(logits.data)
                loss_sum += float(loss.data) * len(labels)
                top1 += count_correct(host_logits, labels, 1)
                top5 += count_correct(host_logits, labels, 5)
                count += len(labels)
        loss_sum, top1, top5, count, skipped = self.comm.sum([loss_sum, top1, top5, count, self.loader.skipped])
        if count == 0 and skipped:  # every rank knows it: each stops with the same line
            raise UserError(f"every validation image ({int(skipped)}) could not be decoded (moved, deleted or "
                            "damaged files): repair the validation set, then continue with --resume auto")
        return {"val_loss": loss_sum / count, "val_top1": top1 / count, "val_top5": top5 / count,
                "val_skipped": int(skipped)}
