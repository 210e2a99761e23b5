"""The optimizer side of the large-minibatch recipe: LARS, gradient accumulation, batch-size control."""
import json

import numpy as np
import pytest

from minidl import Tensor, nn, ops
from minidl.config import Config
from minidl.data import make_embedded_dataset
from minidl.optim import LARS, SGD
from minidl.trainer import run


class SmallNet(nn.Module):
    """No batch norm: a batch's gradient is then the mean of its images' gradients."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        return self.fc(ops.global_avg_pool(ops.relu(self.conv(x))))


def small_net(seed=0):
    nn.manual_seed(seed)
    return SmallNet().astype(np.float64)


def batch(n, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 6, 6, 3)), rng.integers(0, 5, n)


def backward(model, images, labels):
    ops.softmax_cross_entropy(model(Tensor(images)), labels).backward()


def test_lars_step_matches_a_per_tensor_hand_computation():
    """Three steps, the rate tripled before the last: with the rate inside the velocity, a
    change of lr rescales v by lr_new / lr_old (Goyal's momentum correction)."""
    model = small_net()
    images, labels = batch(8, 1)
    before = {name: p.data.copy() for name, p in model.named_parameters()}
    momentum, wd, eta = 0.9, 1e-3, 0.02
    opt = LARS(model.parameters(), lr=0.5, momentum=momentum, weight_decay=wd, eta=eta, norm_weight_decay=0.0)
    velocity = {name: np.zeros_like(w) for name, w in before.items()}
    for step, lr in enumerate((0.5, 0.5, 1.5)):
        if step and lr != opt.lr:
            velocity = {name: v * lr / opt.lr for name, v in velocity.items()}
        opt.lr = lr
        opt.zero_grad()
        backward(model, images, labels)
        for name, p in model.named_parameters():  # the oracle: You et al., one tensor at a time
            w, g = before[name], p.grad.data.copy()
            decay = 0.0 if p.kind == "bias" else wd
            trust = eta * np.linalg.norm(w) / (np.linalg.norm(g) + decay * np.linalg.norm(w))
            if p.kind == "bias":
                trust = 1.0
            velocity[name] = momentum * velocity[name] + lr * trust * (g + decay * w)
            before[name] = w - velocity[name]
        opt.step()
        for name, p in model.named_parameters():
            np.testing.assert_allclose(p.data, before[name], rtol=1e-10, atol=1e-14, err_msg=f"{name} step {step}")


@pytest.mark.parametrize("accum", [2, 4])
def test_gradient_accumulation_equals_one_larger_batch(accum):
    """k micro-batches with grad_scale 1/k give the same update as one batch k times larger."""
    images, labels = batch(8 * accum, 3)
    big, small = small_net(), small_net()
    opt_big = SGD(big.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    opt_small = SGD(small.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3, grad_scale=1.0 / accum)
    for _ in range(3):
        opt_big.zero_grad()
        backward(big, images, labels)
        opt_big.step()
        opt_small.zero_grad()
        for k in range(accum):
            backward(small, images[8 * k:8 * (k + 1)], labels[8 * k:8 * (k + 1)])
        opt_small.step()
    np.testing.assert_allclose(opt_small.flat.data, opt_big.flat.data, rtol=1e-12, atol=1e-15)


def test_batch_size_control_end_to_end(tmp_path):
    data = make_embedded_dataset(tmp_path / "data", train_per_class=16, val_per_class=4)
    config = Config(data_path=str(data), model="resnet20", batch_schedule="0:32,1:64", max_per_rank_batch=32,
                    epochs=2, lr=0.1, lr_base_batch=64, lr_scheduler="constant", train_crop_size=32,
                    val_crop_size=32, val_resize_size=32, augment="none", output_dir=str(tmp_path / "out"))
    run(config)
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["global_batch"] for m in metrics] == [32, 64]
    assert [m["lr"] for m in metrics] == pytest.approx([0.05, 0.1])
