"""The fused ops (minidl.ops.norm_relu) on the reference path: the unfused composition's results bit
for bit (forward, every gradient, running statistics; plain, with a residual, ghost groups,
eval), central finite differences, and whole residual networks with fused blocks against the
same networks with the blocks written with unfused ops. (Their GPU branch runs on the kernel
emulator: tests/kernels/test_emulated_steps.py.)"""
import numpy as np
import pytest

from helpers import check_gradients, rng, unfused_block_forward
from minidl import Tensor, nn, ops
from minidl.models import MODELS
from minidl.models.resnet import BasicBlock, Bottleneck
from minidl.optim import SGD


def norm_state(channels, seed, dtype):
    r = rng(seed)
    gamma, beta = 1 + 0.5 * r.standard_normal(channels), r.standard_normal(channels)
    return [a.astype(dtype) for a in (gamma, beta, r.standard_normal(channels), 0.5 + r.random(channels))]


def run(op, x, residual, state, training, group_size, gy):
    """Output, input gradients and running statistics of op(x[, residual], γ, β, stats...)."""
    gamma, beta, mean, var = (a.copy() for a in state)
    inputs = [Tensor(a.copy(), requires_grad=True) for a in [x] + ([residual] if residual is not None else [])]
    params = [Tensor(gamma, requires_grad=True), Tensor(beta, requires_grad=True)]
    y = op(*inputs, *params, mean, var, training, 0.1, 1e-5, group_size)
    y.backward(gy)
    return [y.data] + [t.grad.data for t in inputs + params] + [mean, var]


def unfused(x, *rest):
    """relu(batch_norm(x) [+ residual]) from the unfused ops; rest = [residual,] γ, β, stats..."""
    residual, rest = (rest[0], rest[1:]) if len(rest) == 9 else (None, rest)
    out = ops.batch_norm(x, *rest)
    return ops.relu(out if residual is None else ops.add(out, residual))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("residual", [False, True], ids=["relu", "add_relu"])
@pytest.mark.parametrize("training, group_size", [(True, None), (False, None), (True, 2)],
                         ids=["train", "eval", "ghost"])
def test_fused_op_equals_the_unfused_ops_bit_for_bit(dtype, residual, training, group_size):
    r = rng(0)
    shape = (4, 3, 5, 6)
    x = (2.0 + 1.5 * r.standard_normal(shape)).astype(dtype)
    res = r.standard_normal(shape).astype(dtype) if residual else None
    gy = r.standard_normal(shape).astype(dtype)
    state = norm_state(shape[-1], 1, dtype)
    fused = ops.batch_norm_add_relu if residual else ops.batch_norm_relu
    for ours, theirs in zip(run(fused, x, res, state, training, group_size, gy),
                            run(unfused, x, res, state, training, group_size, gy)):
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)


@pytest.mark.parametrize("residual", [False, True], ids=["relu", "add_relu"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_fused_op_gradients_against_finite_differences(residual, training):
    r = rng(3)
    shape = (2, 3, 2, 3)
    gamma, beta, mean, var = norm_state(shape[-1], 4, np.float64)
    arrays = [1.0 + r.standard_normal(shape)] + ([r.standard_normal(shape)] if residual else []) + [gamma, beta]

    def op(*tensors):  # x[, residual], γ, β; fresh statistics at every call (training updates them)
        return (ops.batch_norm_add_relu if residual else ops.batch_norm_relu)(*tensors, mean.copy(), var.copy(),
                                                                              training)

    check_gradients(op, *arrays)


def test_ghost_groups_must_divide_the_batch():
    state = norm_state(3, 0, np.float64)
    with pytest.raises(ValueError, match="does not split into BN groups of 4"):
        ops.batch_norm_relu(Tensor(np.ones((6, 2, 2, 3))), *state, group_size=4)


def test_the_dtype_policy_ops_are_the_identity_for_float_data():
    x = Tensor(np.ones((2, 3)))
    assert ops.to_compute_dtype(x, None) is x and ops.to_compute_dtype(x, x.dtype) is x and ops.to_float(x) is x


def training_step(model, seed):
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    r = rng(seed)
    loss = ops.softmax_cross_entropy(model(Tensor(r.standard_normal((4, 16, 16, 3)).astype(np.float32))),
                                     r.integers(0, 10, 4), label_smoothing=0.1)
    loss.backward()
    optimizer.step()
    return [loss.data, optimizer.flat.grad, optimizer.flat.data] + [b for _, b in model.named_buffers()]


@pytest.mark.parametrize("name", ["resnet20", "resnet18"])
def test_fused_networks_train_as_the_unfused_ones_bit_for_bit(name, monkeypatch):
    nn.manual_seed(0)
    fused = training_step(MODELS[name](num_classes=10), seed=1)
    for block in (BasicBlock, Bottleneck):
        monkeypatch.setattr(block, "forward", unfused_block_forward)
    nn.manual_seed(0)
    reference = training_step(MODELS[name](num_classes=10), seed=1)
    for ours, theirs in zip(fused, reference):
        assert np.array_equal(ours, theirs)
