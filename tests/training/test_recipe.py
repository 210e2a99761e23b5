"""The optimizer side of the large-minibatch recipe: LARS, gradient accumulation, batch-size control."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minidl import Tensor, nn, ops
from minidl.checkpoint import load_checkpoint
from minidl.config import Config
from minidl.data import make_embedded_dataset
from minidl.optim import LARS, SGD
from minidl.trainer import run
from mpi.launch import mpiexec, require_mpi


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


def test_caffe2_form_with_momentum_correction_takes_the_pytorch_steps_across_a_rate_jump():
    """Goyal et al., remark 2: v ← m·v + η·g needs v ← v·η_new/η_old when η changes; then it is
    u ← m·u + g; w ← w − η·u in another coordinate. Without the correction it is not."""
    images, labels = batch(8, 4)
    runs = {}
    for form, correction in (("pytorch", True), ("caffe2", True), ("caffe2", False)):
        model = small_net()
        opt = SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3, form=form,
                  momentum_correction=correction)
        for lr in (0.1, 0.1, 0.4, 0.4, 0.05):
            opt.lr = lr
            opt.zero_grad()
            backward(model, images, labels)
            opt.step()
        runs[form, correction] = opt.flat.data.copy()
    np.testing.assert_allclose(runs["caffe2", True], runs["pytorch", True], rtol=1e-11, atol=1e-14)
    assert np.abs(runs["caffe2", False] - runs["pytorch", True]).max() > 1e-4


def test_ghost_batch_norm_normalizes_each_group_as_its_own_batch():
    """Oracle: torch's batch norm applied to each group of images in turn (forward, input and
    parameter gradients, running statistics updated group after group)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((12, 3, 3, 4)) * 2 + 1
    gamma, beta, upstream = rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal((12, 3, 3, 4))
    mean, var = np.zeros(4), np.ones(4)
    xt, gt, bt = (Tensor(a.copy(), requires_grad=True) for a in (x, gamma, beta))
    y = ops.batch_norm(xt, gt, bt, mean, var, training=True, group_size=4)
    (y * Tensor(upstream)).sum().backward()

    x_ref = torch.tensor(x.transpose(0, 3, 1, 2), requires_grad=True)
    g_ref, b_ref = torch.tensor(gamma, requires_grad=True), torch.tensor(beta, requires_grad=True)
    mean_ref, var_ref = torch.zeros(4, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    outs = [torch.nn.functional.batch_norm(x_ref[k:k + 4], mean_ref, var_ref, g_ref, b_ref, training=True)
            for k in range(0, 12, 4)]
    y_ref = torch.cat(outs)
    (y_ref * torch.tensor(upstream.transpose(0, 3, 1, 2))).sum().backward()
    np.testing.assert_allclose(y.data, y_ref.detach().numpy().transpose(0, 2, 3, 1), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(xt.grad.data, x_ref.grad.numpy().transpose(0, 2, 3, 1), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gt.grad.data, g_ref.grad.numpy(), rtol=1e-9)
    np.testing.assert_allclose(bt.grad.data, b_ref.grad.numpy(), rtol=1e-9)
    np.testing.assert_allclose(mean, mean_ref.numpy(), rtol=1e-12)
    np.testing.assert_allclose(var, var_ref.numpy(), rtol=1e-12)


def test_ghost_batch_norm_needs_groups_that_divide_the_batch():
    with pytest.raises(ValueError, match="does not split"):
        ops.batch_norm(Tensor(np.zeros((6, 2, 2, 3))), Tensor(np.ones(3)), Tensor(np.zeros(3)), None, None,
                       training=True, group_size=4)


def trained_state(data, output_dir, **batch_layout):
    """The final checkpoint's arrays after 2 epochs of 2 steps of 64 images, laid out as asked."""
    run(Config(data_path=str(data), model="resnet8_w8", batch_schedule="0:64", epochs=2, lr=0.1, lr_base_batch=32,
               lr_scheduler="constant", train_crop_size=16, val_crop_size=16, val_resize_size=16, augment="cifar",
               output_dir=str(output_dir), **batch_layout))
    return load_checkpoint(sorted(Path(output_dir).glob("checkpoint-*.h5"))[-1])[0]


def test_ghost_batch_norm_trains_like_accumulated_workers(tmp_path):
    """Per-worker BN two ways: two micro-batches of 32 accumulated (each its own BN), or one
    micro-batch of 64 with BN over groups of 32. Same images, gradients, running statistics
    and weights, up to float32 summation order; BN over all 64 images differs far more."""
    data = make_embedded_dataset(tmp_path / "data", train_per_class=13, val_per_class=2, image_size=16)
    accumulated = trained_state(data, tmp_path / "accumulated", max_per_rank_batch=32)
    ghost = trained_state(data, tmp_path / "ghost", max_per_rank_batch=64, bn_group_size=32)
    whole = trained_state(data, tmp_path / "whole", max_per_rank_batch=64)
    assert accumulated.keys() == ghost.keys()
    for name, array in accumulated.items():
        np.testing.assert_allclose(ghost[name], array, rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.abs(whole["optimizer/params"] - accumulated["optimizer/params"]).max() > 1e-3


@pytest.mark.slow
def test_batch_size_control_under_mpiexec_grows_accumulation_and_rate(tmp_path):
    """2 ranks, global batch 32 then 64 with micro-batches capped at 16: the second epoch
    accumulates 2 micro-batches per rank and runs at twice the rate."""
    require_mpi()
    data = make_embedded_dataset(tmp_path / "data", train_per_class=16, val_per_class=4)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIDL_")}
    env.update(MINIDL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MINIDL_DEVICE="cpu")
    argv = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", str(Path(__file__).parents[2] / "train.py"),
            "--data-path", str(data), "--model", "resnet20", "--batch-schedule", "0:32,1:64",
            "--max-per-rank-batch", "16", "--epochs", "2", "--lr", "0.1", "--lr-base-batch", "64",
            "--lr-scheduler", "constant", "--train-crop-size", "32", "--val-crop-size", "32",
            "--val-resize-size", "32", "--augment", "none", "--output-dir", str(tmp_path / "out")]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["global_batch"] for m in metrics] == [32, 64]
    assert [m["lr"] for m in metrics] == pytest.approx([0.05, 0.1])
    steps = [json.loads(line) for line in (tmp_path / "out" / "steps.jsonl").read_text().splitlines()]
    assert {s["global_batch"] for s in steps if s["epoch"] > 1} == {64}
