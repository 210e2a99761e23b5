"""Forward and backward of the ops against PyTorch on the CPU, float64, 1e-6 relative.

minidl is NHWC / KRSC; torch gets NCHW / KCRS copies (helpers.nhwc_to_nchw, krsc_to_kcrs) and
its results are permuted back. Backward uses a random upstream gradient G: the gradients
compared are those of sum(op(...) * G).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import assert_close, distinct, krsc_to_kcrs, nchw_to_nhwc, nhwc_to_nchw, rng
from minidl import Tensor, ops


def leaf(array):
    return Tensor(np.array(array, dtype=np.float64), requires_grad=True)


def torch_leaf(array):
    return torch.tensor(np.ascontiguousarray(array), dtype=torch.float64, requires_grad=True)


def backprop_minidl(out, upstream):
    (out * Tensor(upstream)).sum().backward()


def backprop_torch(out, upstream):
    (out * torch.from_numpy(np.ascontiguousarray(upstream))).sum().backward()


@pytest.mark.parametrize("x_shape,w_shape,stride,padding,bias", [
    ((2, 9, 7, 3), (8, 3, 3, 3), 1, 1, True),
    ((2, 9, 7, 3), (8, 3, 3, 3), 2, 1, False),
    ((1, 15, 13, 3), (4, 7, 7, 3), 2, 3, False),
    ((3, 6, 5, 8), (6, 1, 1, 8), 1, 0, True),
    ((3, 7, 6, 8), (6, 1, 1, 8), 2, 0, False),
    ((2, 8, 8, 4), (5, 3, 3, 4), 2, 0, True),
], ids=["3x3s1p1", "3x3s2p1", "7x7s2p3", "1x1", "1x1s2", "3x3s2p0"])
def test_conv2d(x_shape, w_shape, stride, padding, bias):
    r = rng(20)
    x, w = r.standard_normal(x_shape), r.standard_normal(w_shape)
    b = r.standard_normal(w_shape[0]) if bias else None
    xt, wt = leaf(x), leaf(w)
    bt = leaf(b) if bias else None
    y = ops.conv2d(xt, wt, bt, stride=stride, padding=padding)

    x_ref = nhwc_to_nchw(x).requires_grad_()
    w_ref = torch.from_numpy(krsc_to_kcrs(w)).requires_grad_()
    b_ref = torch_leaf(b) if bias else None
    y_ref = F.conv2d(x_ref, w_ref, b_ref, stride=stride, padding=padding)
    assert_close(y.data, nchw_to_nhwc(y_ref), name="output")

    upstream = r.standard_normal(y.shape)
    backprop_minidl(y, upstream)
    backprop_torch(y_ref, upstream.transpose(0, 3, 1, 2))
    assert_close(xt.grad.data, nchw_to_nhwc(x_ref.grad), name="grad x")
    assert_close(wt.grad.data, w_ref.grad.numpy().transpose(0, 2, 3, 1), name="grad w")
    if bias:
        assert_close(bt.grad.data, b_ref.grad.numpy(), name="grad b")


@pytest.mark.parametrize("momentum,eps", [(0.1, 1e-5), (0.5, 1e-3), (1.0, 1e-5)])
@pytest.mark.parametrize("shape", [(4, 5, 3, 6), (2, 1, 1, 3)], ids=["4x5x3x6", "2x1x1x3"])
def test_batch_norm_training(shape, momentum, eps):
    r = rng(21)
    c = shape[-1]
    x = 3.0 + 2.0 * r.standard_normal(shape)
    gamma, beta = 1 + 0.3 * r.standard_normal(c), r.standard_normal(c)
    running_mean, running_var = r.standard_normal(c), 0.5 + r.random(c)
    ref_mean, ref_var = torch.tensor(running_mean), torch.tensor(running_var)

    xt, gt, bt = leaf(x), leaf(gamma), leaf(beta)
    y = ops.batch_norm(xt, gt, bt, running_mean, running_var, training=True, momentum=momentum, eps=eps)
    x_ref, g_ref, b_ref = nhwc_to_nchw(x).requires_grad_(), torch_leaf(gamma), torch_leaf(beta)
    y_ref = F.batch_norm(x_ref, ref_mean, ref_var, g_ref, b_ref, training=True, momentum=momentum, eps=eps)

    assert_close(y.data, nchw_to_nhwc(y_ref), name="output")
    assert_close(running_mean, ref_mean.numpy(), name="running_mean")
    assert_close(running_var, ref_var.numpy(), name="running_var (unbiased)")

    assert_same_batch_norm_grads(y, y_ref, r.standard_normal(shape), (xt, gt, bt), (x_ref, g_ref, b_ref))


def assert_same_batch_norm_grads(y, y_ref, upstream, ours, theirs):
    backprop_minidl(y, upstream)
    backprop_torch(y_ref, upstream.transpose(0, 3, 1, 2))
    (xt, gt, bt), (x_ref, g_ref, b_ref) = ours, theirs
    assert_close(xt.grad.data, nchw_to_nhwc(x_ref.grad), name="grad x")
    assert_close(gt.grad.data, g_ref.grad.numpy(), name="grad gamma")
    assert_close(bt.grad.data, b_ref.grad.numpy(), name="grad beta")


def test_batch_norm_running_stats_accumulate_over_steps():
    r = rng(22)
    running_mean, running_var = np.zeros(3), np.ones(3)
    ref_mean, ref_var = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    gamma, beta = np.ones(3), np.zeros(3)
    for step in range(3):
        x = step + r.standard_normal((2, 3, 2, 3))
        ops.batch_norm(Tensor(x), Tensor(gamma), Tensor(beta), running_mean, running_var, training=True)
        F.batch_norm(nhwc_to_nchw(x), ref_mean, ref_var, torch.tensor(gamma), torch.tensor(beta), training=True)
    assert_close(running_mean, ref_mean.numpy(), name="running_mean")
    assert_close(running_var, ref_var.numpy(), name="running_var")


def test_batch_norm_eval():
    r = rng(23)
    shape, c = (3, 4, 5, 4), 4
    x = 1.0 + r.standard_normal(shape)
    gamma, beta = 1 + 0.3 * r.standard_normal(c), r.standard_normal(c)
    running_mean, running_var = r.standard_normal(c), 0.5 + r.random(c)
    saved = running_mean.copy(), running_var.copy()

    xt, gt, bt = leaf(x), leaf(gamma), leaf(beta)
    y = ops.batch_norm(xt, gt, bt, running_mean, running_var, training=False, eps=1e-3)
    x_ref, g_ref, b_ref = nhwc_to_nchw(x).requires_grad_(), torch_leaf(gamma), torch_leaf(beta)
    y_ref = F.batch_norm(x_ref, torch.tensor(running_mean), torch.tensor(running_var), g_ref, b_ref,
                         training=False, eps=1e-3)
    assert_close(y.data, nchw_to_nhwc(y_ref), name="output")
    np.testing.assert_array_equal(running_mean, saved[0])  # eval never touches the statistics
    np.testing.assert_array_equal(running_var, saved[1])

    assert_same_batch_norm_grads(y, y_ref, r.standard_normal(shape), (xt, gt, bt), (x_ref, g_ref, b_ref))


def check_nhwc_op_against_torch(ours, theirs, x):
    """Forward and input gradient of a single-input NHWC op vs its NCHW torch twin."""
    xt = leaf(x)
    y = ours(xt)
    x_ref = nhwc_to_nchw(x).requires_grad_()
    y_ref = theirs(x_ref)
    expected = nchw_to_nhwc(y_ref) if y_ref.ndim == 4 else y_ref.detach().numpy()
    assert_close(y.data, expected, name="output")
    upstream = rng(24).standard_normal(y.shape)
    backprop_minidl(y, upstream)
    backprop_torch(y_ref, upstream.transpose(0, 3, 1, 2) if upstream.ndim == 4 else upstream)
    assert_close(xt.grad.data, nchw_to_nhwc(x_ref.grad), name="grad x")


@pytest.mark.parametrize("kernel,stride,padding,shape", [
    (3, 2, 1, (2, 9, 8, 3)), (3, 2, 1, (1, 6, 6, 2)), (2, 2, 0, (2, 6, 8, 3)), (2, 2, 0, (2, 7, 5, 2)),
    (3, 1, 1, (1, 4, 5, 2)),
], ids=["3x3s2p1", "3x3s2p1_even", "2x2s2", "2x2s2_odd", "3x3s1p1"])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "relu_ties"])
def test_max_pool2d(kernel, stride, padding, shape, ties):
    # with ties (zeros after a ReLU) minidl promises torch's routing: the first maximum in (r, s) order
    x = np.maximum(rng(25).standard_normal(shape), 0) if ties else distinct(shape, seed=25)
    check_nhwc_op_against_torch(lambda t: ops.max_pool2d(t, kernel, stride, padding),
                                lambda t: F.max_pool2d(t, kernel, stride, padding), x)


def test_max_pool2d_all_negative_with_padding():
    """Padding must never win a window: it is -inf, not 0."""
    x = -1.0 - rng(26).random((1, 5, 5, 2))
    check_nhwc_op_against_torch(lambda t: ops.max_pool2d(t, 3, 2, 1), lambda t: F.max_pool2d(t, 3, 2, 1), x)


def test_relu():
    x = rng(27).standard_normal((2, 4, 3, 5))
    check_nhwc_op_against_torch(ops.relu, F.relu, x)


def test_global_avg_pool():
    x = rng(28).standard_normal((3, 5, 4, 6))
    check_nhwc_op_against_torch(ops.global_avg_pool, lambda t: t.mean(dim=(2, 3)), x)


@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    r = rng(29)
    x, w, b = r.standard_normal((5, 7)), r.standard_normal((4, 7)), r.standard_normal(4)
    xt, wt, bt = leaf(x), leaf(w), leaf(b) if bias else None
    x_ref, w_ref, b_ref = torch_leaf(x), torch_leaf(w), torch_leaf(b) if bias else None
    y, y_ref = ops.linear(xt, wt, bt), F.linear(x_ref, w_ref, b_ref)
    assert_close(y.data, y_ref.detach().numpy(), name="output")
    upstream = r.standard_normal(y.shape)
    backprop_minidl(y, upstream)
    backprop_torch(y_ref, upstream)
    assert_close(xt.grad.data, x_ref.grad.numpy(), name="grad x")
    assert_close(wt.grad.data, w_ref.grad.numpy(), name="grad w")
    if bias:
        assert_close(bt.grad.data, b_ref.grad.numpy(), name="grad b")


@pytest.mark.parametrize("smoothing", [0.0, 0.05, 0.1, 0.3, 1.0])
@pytest.mark.parametrize("batch,classes,scale", [(6, 10, 1.0), (1, 3, 1.0), (4, 1000, 2.5)])
def test_softmax_cross_entropy(smoothing, batch, classes, scale):
    r = rng(30)
    logits = 4 * r.standard_normal((batch, classes)) + 50  # a large offset: the log-softmax must be stable
    labels = r.integers(0, classes, size=batch)
    zt, z_ref = leaf(logits), torch_leaf(logits)
    loss = ops.softmax_cross_entropy(zt, labels, label_smoothing=smoothing)
    loss_ref = F.cross_entropy(z_ref, torch.from_numpy(labels), label_smoothing=smoothing)
    assert loss.shape == ()
    assert_close(loss.data, loss_ref.detach().numpy(), name="loss")
    (loss * scale).backward()  # a non-unit upstream gradient
    (loss_ref * scale).backward()
    assert_close(zt.grad.data, z_ref.grad.numpy(), name="grad logits")


@pytest.mark.parametrize("as_type", ["int64", "int32", "list", "tensor"])
def test_softmax_cross_entropy_label_containers(as_type):
    r = rng(31)
    logits, labels = r.standard_normal((4, 5)), np.array([4, 0, 2, 2])
    given = {"int64": labels, "int32": labels.astype(np.int32), "list": labels.tolist(),
             "tensor": Tensor(labels)}[as_type]
    loss = ops.softmax_cross_entropy(Tensor(logits), given, label_smoothing=0.1)
    expected = F.cross_entropy(torch.tensor(logits), torch.from_numpy(labels), label_smoothing=0.1)
    assert_close(loss.data, expected.numpy(), name="loss")
