"""Softmax cross-entropy, mean over the batch, with torch's label smoothing:
target = (1 − ε)·onehot + ε/K, so loss = (1 − ε)·NLL + ε·mean_k(−log p_k).
The gradient with respect to the logits is (softmax − target) / N.
"""
from minidl.autograd import Tensor
from minidl.backend import get_array_module
from minidl.ops.dispatch import Op


def log_softmax(logits):
    xp = get_array_module(logits)
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))


class SoftmaxCrossEntropy(Op):
    def __init__(self, labels, label_smoothing):
        self.labels, self.eps = labels, label_smoothing

    def forward_kernels(self, kernels, logits):  # forward and backward in one pass; backward scales by gy
        loss, self.grad = kernels.softmax_cross_entropy(logits, self.labels, self.eps)
        return loss

    def backward_kernels(self, kernels, gy):
        return self.grad * gy

    def forward_reference(self, logits):
        xp = get_array_module(logits)
        n, k = logits.shape
        logp = log_softmax(logits)
        self.logp = logp
        nll = -logp[xp.arange(n), self.labels]
        smooth = -logp.mean(axis=1)
        return ((1 - self.eps) * nll + self.eps * smooth).mean()

    def backward_reference(self, gy):
        xp = get_array_module(self.logp)
        n, k = self.logp.shape
        grad = xp.exp(self.logp)
        grad -= self.eps / k
        grad[xp.arange(n), self.labels] -= 1 - self.eps
        grad *= gy / n
        return grad


def softmax_cross_entropy(logits, labels, label_smoothing=0.0):
    """Mean over the batch of the cross-entropy between softmax(logits) (N, K) and integer
    `labels` (N,), with label smoothing ε as torch defines it."""
    labels = labels.data if isinstance(labels, Tensor) else labels
    return SoftmaxCrossEntropy(labels, label_smoothing)(logits)
