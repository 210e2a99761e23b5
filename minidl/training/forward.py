"""The forward pass of a training or evaluation step: a uint8 NHWC batch normalized on the
device (minidl.data.normalize), the model, the softmax cross-entropy."""
from minidl import ops
from minidl.autograd import Tensor
from minidl.backend import xp
from minidl.data.transforms import normalize


def forward_loss(model, images, labels, label_smoothing):
    """(logits, mean loss) of `model` on the batch; labels on the host or the device."""
    logits = model(Tensor(normalize(images, xp)))
    return logits, ops.softmax_cross_entropy(logits, xp.asarray(labels), label_smoothing)
