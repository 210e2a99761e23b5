"""Batch norm fused into the convolutions (minidl.ops.normconv, `fuse=True` models) on the CPU:
residual blocks and whole networks against the same ones with separate ops (the oracle), in
float64 to 1e-10 relative — outputs, running statistics, every gradient — for identity and
projection shortcuts, stride 2, ghost groups and evaluation; the statistics themselves; finite
differences through each op; chunks that straddle ghost groups; results that do not depend on
the thread count. (The kernel composition runs on the emulator: tests/kernels/test_emulated_steps.py.)"""
import numpy as np
import pytest

from helpers import assert_close, check_gradients, rng
from minidl import Tensor, nn, ops, parallel
from minidl.models import MODELS
from minidl.models.resnet import BasicBlock, Bottleneck
from minidl.ops import conv

BLOCKS = {  # build(fuse), input shape (odd sizes)
    "basic, identity": (lambda fuse: BasicBlock(8, 8, 1, fuse), (4, 6, 5, 8)),
    "basic, projection, stride 2": (lambda fuse: BasicBlock(6, 8, 2, fuse), (4, 7, 6, 6)),
    "bottleneck, identity": (lambda fuse: Bottleneck(16, 4, 1, fuse), (4, 5, 6, 16)),
    "bottleneck, projection, stride 2": (lambda fuse: Bottleneck(8, 4, 2, fuse), (4, 7, 5, 8)),
}
MODES = {"train": (True, None), "ghost groups of 2": (True, 2), "eval": (False, None)}


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of one or two images: they straddle ghost groups, and every multi-chunk path runs."""
    monkeypatch.setattr(parallel, "CHUNK_BYTES", 1024)
    monkeypatch.setattr(conv, "MIN_ROWS", 1)


def randomize_norms(model, seed):
    """γ, β and the running statistics drawn at random (the initial ones hide mistakes)."""
    r = rng(seed)
    for _, module in model.named_modules():
        if isinstance(module, nn.BatchNorm2d):
            channels = module.weight.shape
            module.weight.data[...] = r.uniform(0.5, 1.5, channels)
            module.bias.data[...] = r.uniform(-0.5, 0.5, channels)
            module.running_mean[...] = r.uniform(-0.2, 0.2, channels)
            module.running_var[...] = r.uniform(0.5, 2.0, channels)
    return model


def set_mode(model, training, group_size):
    model.train(training)
    for _, module in model.named_modules():
        if isinstance(module, nn.BatchNorm2d):
            module.group_size = group_size
    return model


def block_results(build, fuse, shape, training, group_size):
    """Output, input gradient, parameter gradients and buffers of one block in float64."""
    nn.manual_seed(0)
    block = set_mode(randomize_norms(build(fuse).astype(np.float64), 1), training, group_size)
    x = Tensor(0.5 + rng(2).standard_normal(shape), requires_grad=True)
    y = block(x)
    y.backward(rng(3).standard_normal(y.shape))
    results = {"output": y.data, "input gradient": x.grad.data}
    results.update((f"{name} gradient", p.grad.data) for name, p in block.named_parameters())
    results.update(block.named_buffers())
    return results


def assert_all_close(ours, theirs, rtol=1e-10):
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert_close(ours[name], theirs[name], rtol=rtol, atol_scale=rtol, name=name)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("block", BLOCKS)
def test_fused_block_equals_the_block_of_separate_ops(block, mode):
    build, shape = BLOCKS[block]
    assert_all_close(block_results(build, True, shape, *MODES[mode]), block_results(build, False, shape, *MODES[mode]))


@pytest.mark.parametrize("block", ["basic, projection, stride 2", "bottleneck, identity"])
def test_fused_block_over_chunks_that_straddle_ghost_groups(small_chunks, monkeypatch, block):
    build, shape = BLOCKS[block]
    shape = (6, *shape[1:])
    expected = block_results(build, False, shape, True, 3)
    runs = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(parallel, "num_threads", threads)
        runs.append(block_results(build, True, shape, True, 3))
    assert_all_close(runs[0], expected)
    for other in runs[1:]:  # the chunks are merged in image order: the threads change nothing
        assert all(np.array_equal(other[name], runs[0][name]) for name in expected)


def fused_chain(x, w1, gamma, beta, w2, gamma2, beta2, group_size=None):
    """relu(bn2(conv(relu(bn1(conv(x, w1))), w2)) as the three fused ops (fresh running statistics)."""
    channels = w1.shape[0]
    bn = [ops.BN(g, b, np.zeros(channels), np.ones(channels), group_size=group_size)
          for g, b in ((gamma, beta), (gamma2, beta2))]
    y, stats = ops.conv2d_stats(x, w1, 1, 1, group_size=group_size)
    y, stats = ops.bn_relu_conv2d_stats(y, stats, bn[0], w2, 2, 1)
    return ops.bn_add_relu(y, stats, bn[1])


def test_fused_chain_gradients_against_finite_differences():
    r = rng(4)
    x = 0.5 + r.standard_normal((4, 5, 4, 2))
    w1, w2 = r.standard_normal((3, 3, 3, 2)), r.standard_normal((3, 3, 3, 3))
    norms = [1 + 0.3 * r.standard_normal(3), 0.3 * r.standard_normal(3)] * 2
    check_gradients(lambda *t: fused_chain(*t, group_size=2), x, w1, norms[0], norms[1], w2, norms[2], norms[3])


def test_projection_end_gradients_against_finite_differences():
    r = rng(5)
    y, residual = r.standard_normal((2, 3, 3, 4)), 1 + r.standard_normal((2, 3, 3, 4))

    def op(y, residual, gamma, beta, residual_gamma, residual_beta):
        stats = [Tensor(np.stack([a.data.mean(axis=(0, 1, 2)), a.data.var(axis=(0, 1, 2))])[None])
                 for a in (y, residual)]  # the statistics of the very data: their gradients flow through bn
        bn, residual_bn = (ops.BN(g, b, training=True) for g, b in ((gamma, beta), (residual_gamma, residual_beta)))
        return ops.bn_add_relu(y, stats[0], bn, residual, stats[1], residual_bn)

    check_gradients(op, y, residual, *(r.uniform(0.5, 1.5, 4) for _ in range(2)), *(r.uniform(-0.5, 0.5, 4)
                                                                                      for _ in range(2)))


@pytest.mark.parametrize("group_size", [None, 2])
def test_conv2d_stats_are_the_output_statistics_of_each_group(small_chunks, group_size):
    r = rng(6)
    x, w = r.standard_normal((4, 5, 6, 3)), r.standard_normal((7, 3, 3, 3))
    y, stats = ops.conv2d_stats(Tensor(x), Tensor(w), 2, 1, training=True, group_size=group_size)
    np.testing.assert_allclose(y.data, conv.correlate(x, w, 2, 1), rtol=1e-12)
    groups = y.data.reshape(-1 if group_size is None else 4 // group_size, group_size or 4, *y.shape[1:])
    np.testing.assert_allclose(stats.data[:, 0], groups.mean(axis=(1, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(stats.data[:, 1], groups.var(axis=(1, 2, 3)), rtol=1e-10)


def test_evaluation_takes_no_statistics_and_a_mismatch_is_refused():
    x, w = Tensor(np.ones((4, 3, 3, 2))), Tensor(np.ones((2, 1, 1, 2)))
    y, stats = ops.conv2d_stats(x, w, training=False)
    assert stats.shape == (0, 2, 2)
    y, stats = ops.conv2d_stats(x, w, group_size=2)
    with pytest.raises(ValueError, match="statistics of 2 groups for a batch norm over 1"):
        ops.bn_add_relu(y, stats, ops.BN(Tensor(np.ones(2)), Tensor(np.zeros(2))))


def network_step(name, fuse, shape, group_size):
    """Loss, every gradient and every buffer after one training step in float64."""
    nn.manual_seed(0)
    model = set_mode(MODELS[name](num_classes=10, fuse=fuse).astype(np.float64), True, group_size)
    r = rng(7)
    loss = ops.softmax_cross_entropy(model(Tensor(r.standard_normal(shape))), r.integers(0, 10, shape[0]))
    loss.backward()
    results = {"loss": loss.data}
    results.update((f"{name} gradient", p.grad.data) for name, p in model.named_parameters())
    results.update(model.named_buffers())
    return results


@pytest.mark.parametrize("name, shape, group_size", [("resnet20", (4, 12, 12, 3), 2), ("resnet50", (4, 64, 64, 3), None)])
def test_fused_network_step_equals_the_step_of_separate_ops(name, shape, group_size):
    assert_all_close(network_step(name, True, shape, group_size), network_step(name, False, shape, group_size))
