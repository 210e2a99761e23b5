"""The GPU branches of minidl.ops, run on the CPU: the emulated kernels are put in charge of
NumPy arrays (`kernels.use`), so a training step of a small network goes through exactly the
code a GPU runs (conv, batch norm, max and average
pool, softmax cross-entropy, the SGD update) and must match the same step on the reference path."""
import numpy
import pytest

import oracle
from minidl import Tensor, kernels, nn, ops
from minidl.optim import SGD


class Net(nn.Module):
    """stem conv (bias, C=3) -> BN -> relu -> max pool -> 3x3 s2 conv -> BN -> relu -> 1x1 conv
    -> BN -> relu -> global average pool -> linear"""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 12, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(12)
        self.conv3 = nn.Conv2d(12, 16, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(ops.relu(self.bn1(self.conv1(x))))
        x = ops.relu(self.bn2(self.conv2(x)))
        x = ops.relu(self.bn3(self.conv3(x)))
        return self.fc(ops.global_avg_pool(x))


class Recording:
    """The emulated Kernels, noting which operations were called."""

    def __init__(self, target):
        self.target, self.called = target, set()

    def __getattr__(self, name):
        self.called.add(name)
        return getattr(self.target, name)


def train_step(nesterov):
    """One step from a fixed seed: (loss, flat gradient, flat parameters, running statistics)."""
    nn.manual_seed(3)
    model = Net()
    for name, p in model.named_parameters():  # non-trivial γ, β
        if p.kind == "norm":
            p.data[...] = numpy.random.default_rng(4).uniform(0.5, 1.5, p.shape)
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=nesterov,
                    norm_weight_decay=0.0)
    rng = numpy.random.default_rng(5)
    x = Tensor(rng.standard_normal((2, 10, 10, 3)).astype(numpy.float32))
    labels = rng.integers(0, 10, 2)
    loss = ops.softmax_cross_entropy(model(x), labels, label_smoothing=0.1)
    optimizer.zero_grad()
    loss.backward()
    grad = optimizer.flat.grad.copy()
    optimizer.step()
    buffers = numpy.concatenate([b.reshape(-1) for _, b in model.named_buffers()])
    return float(loss.data), grad, optimizer.flat.data.copy(), buffers


@pytest.mark.parametrize("tf32", [False, True])
def test_training_step_through_the_gpu_branches(emulated, monkeypatch, tf32):
    reference = train_step(nesterov=True)
    recording = Recording(emulated)
    monkeypatch.setattr(emulated, "allow_tf32", tf32)
    with kernels.use(recording, numpy.ndarray):
        loss, grad, params, buffers = train_step(nesterov=True)

    assert recording.called >= {"conv_forward", "conv_grad_input", "conv_grad_weight", "batch_norm_forward",
                                "batch_norm_backward", "max_pool_forward", "max_pool_backward",
                                "global_avg_pool_forward", "global_avg_pool_backward", "softmax_cross_entropy",
                                "sgd_momentum_update"}
    tolerance = oracle.TOLERANCE["tf32" if tf32 else "fp32"]
    oracle.assert_close(loss, reference[0], tolerance, "loss")
    oracle.assert_close(grad, reference[1], tolerance, "flat gradient")
    oracle.assert_close(params, reference[2], tolerance, "parameters after the step")
    oracle.assert_close(buffers, reference[3], tolerance, "BN running statistics")


@pytest.mark.parametrize("tf32, features", [(False, (24, 10)), (True, (24, 12))])
def test_linear_runs_as_a_one_pixel_convolution(emulated, monkeypatch, tf32, features):
    """ops.linear's GPU branch (the convolution kernels; cuBLAS cannot be captured in a CUDA
    graph) against the float64 products: output and the three gradients."""
    monkeypatch.setattr(emulated, "allow_tf32", tf32)
    rng = numpy.random.default_rng(6)
    in_features, out_features = features
    x, w, b, gy = (rng.standard_normal(shape) for shape in ((5, in_features), (out_features, in_features),
                                                              (out_features,), (5, out_features)))
    inputs = [Tensor(a.astype(numpy.float32), requires_grad=True) for a in (x, w, b)]
    with kernels.use(emulated, numpy.ndarray):
        y = ops.linear(*inputs)
        y.backward(gy.astype(numpy.float32))
    tolerance = oracle.TOLERANCE["tf32" if tf32 else "fp32"]
    oracle.assert_close(y.data, x @ w.T + b, tolerance, "linear output")
    for name, tensor, expected in (("x", inputs[0], gy @ w), ("w", inputs[1], gy.T @ x), ("b", inputs[2], gy.sum(0))):
        oracle.assert_close(tensor.grad.data, expected, tolerance, f"linear gradient of {name}")
