"""Every differentiable op against central finite differences in float64.

Each case checks the gradients of sum(op(inputs) * R) with respect to ALL inputs
(helpers.check_gradients). Inputs avoid the non-differentiable points: ReLU inputs stay away
from 0, max-pool windows hold no ties.
"""
import numpy as np
import pytest

from helpers import away_from_zero, check_gradients, distinct, rng
from minidl import ops

# name: (x shape NHWC, weight shape KRSC, stride, padding, bias)
CONV_CASES = {
    "3x3_s1_p1_bias": ((2, 5, 5, 3), (4, 3, 3, 3), 1, 1, True),
    "3x3_s2_p1_nonsquare": ((2, 7, 6, 2), (3, 3, 3, 2), 2, 1, False),
    "3x3_s2_p0_odd": ((1, 8, 7, 2), (2, 3, 3, 2), 2, 0, True),
    "7x7_s2_p3_stem": ((1, 11, 9, 2), (3, 7, 7, 2), 2, 3, False),
    "7x7_s1_p0_exact_fit": ((1, 7, 8, 2), (2, 7, 7, 2), 1, 0, True),
    "1x1_s1": ((2, 4, 3, 5), (3, 1, 1, 5), 1, 0, False),
    "1x1_s1_bias": ((1, 3, 4, 3), (4, 1, 1, 3), 1, 0, True),
    "1x1_s2_odd": ((2, 5, 7, 3), (4, 1, 1, 3), 2, 0, False),
    "1x1_s2_bias": ((1, 6, 4, 2), (3, 1, 1, 2), 2, 0, True),
    "2x3_kernel_rect": ((1, 5, 6, 2), (2, 2, 3, 2), 1, 1, False),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv2d(case):
    x_shape, w_shape, stride, padding, bias = CONV_CASES[case]
    r = rng(1)
    arrays = [r.standard_normal(x_shape), r.standard_normal(w_shape)]
    if bias:
        arrays.append(r.standard_normal(w_shape[0]))

    def op(x, w, b=None):
        return ops.conv2d(x, w, b, stride=stride, padding=padding)

    check_gradients(op, *arrays)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("shape", [(2, 3, 4, 3), (1, 2, 3, 2)], ids=["n2", "n1"])
def test_batch_norm(training, shape):
    r = rng(2)
    c = shape[-1]
    x = 2.0 + 1.5 * r.standard_normal(shape)
    gamma, beta = 1 + 0.5 * r.standard_normal(c), r.standard_normal(c)
    running_mean, running_var = r.standard_normal(c), 0.5 + r.random(c)

    def op(x, gamma, beta):
        # fresh copies: the training pass updates the running statistics in place
        return ops.batch_norm(x, gamma, beta, running_mean.copy(), running_var.copy(),
                              training=training, momentum=0.1, eps=1e-3)

    check_gradients(op, x, gamma, beta)


def test_batch_norm_without_running_stats():
    r = rng(3)
    check_gradients(lambda x, g, b: ops.batch_norm(x, g, b, None, None, training=True),
                    r.standard_normal((3, 2, 2, 4)), r.standard_normal(4), r.standard_normal(4))


def test_relu():
    check_gradients(ops.relu, away_from_zero((2, 3, 4, 5), seed=4))


# add/mul/sub with broadcasting: both operands, and 0-d operands, must get summed-down gradients
BROADCAST_SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)),
                    ((3, 1), (2, 1, 4)), ((2, 3, 4), ()), ((), (3,)), ((1, 3, 1), (2, 3, 4))]


@pytest.mark.parametrize("a_shape,b_shape", BROADCAST_SHAPES, ids=str)
@pytest.mark.parametrize("name", ["add", "ops.add", "mul", "sub"])
def test_binary_broadcasting(name, a_shape, b_shape):
    op = {"add": lambda a, b: a + b, "ops.add": ops.add, "mul": lambda a, b: a * b,
          "sub": lambda a, b: a - b}[name]
    r = rng(5)
    check_gradients(op, r.standard_normal(a_shape), r.standard_normal(b_shape))


@pytest.mark.parametrize("name", ["neg", "rsub_scalar", "rmul_scalar", "radd_scalar", "square"])
def test_unary_arithmetic(name):
    op = {"neg": lambda x: -x, "rsub_scalar": lambda x: 1.5 - x, "rmul_scalar": lambda x: 3.0 * x,
          "radd_scalar": lambda x: 2.0 + x, "square": lambda x: x * x}[name]
    check_gradients(op, rng(6).standard_normal((3, 4)))


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), ()], ids=str)
def test_reductions(reduction, shape):
    check_gradients(lambda x: getattr(x, reduction)(), rng(7).standard_normal(shape))


@pytest.mark.parametrize("kernel,stride,padding,shape", [
    (3, 2, 1, (2, 7, 6, 3)),   # the ResNet stem pool, non-square, odd
    (3, 2, 1, (1, 8, 8, 2)),
    (2, 2, 0, (2, 6, 4, 3)),
    (2, 2, 0, (1, 5, 7, 2)),   # odd sizes: the last row/column is dropped
], ids=["3x3s2p1_odd", "3x3s2p1_even", "2x2s2", "2x2s2_odd"])
def test_max_pool2d(kernel, stride, padding, shape):
    check_gradients(lambda x: ops.max_pool2d(x, kernel, stride, padding), distinct(shape, seed=8))


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 1, 1, 3), (1, 5, 2, 1)], ids=str)
def test_global_avg_pool(shape):
    check_gradients(ops.global_avg_pool, rng(9).standard_normal(shape))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch", [1, 4])
def test_linear(bias, batch):
    r = rng(10)
    arrays = [r.standard_normal((batch, 6)), r.standard_normal((3, 6))]
    if bias:
        arrays.append(r.standard_normal(3))
    check_gradients(ops.linear, *arrays)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("batch", [1, 5])
def test_softmax_cross_entropy(smoothing, batch):
    labels = rng(11).integers(0, 7, size=batch)
    logits = 3 * rng(12).standard_normal((batch, 7))
    check_gradients(lambda z: ops.softmax_cross_entropy(z, labels, label_smoothing=smoothing), logits)


def test_composite_graph():
    """A small conv net end to end: conv -> BN -> relu -> pool -> gap -> linear -> loss."""
    r = rng(13)
    labels = np.array([1, 0])

    def net(x, w1, g, b, w2, b2):
        h = ops.conv2d(x, w1, stride=1, padding=1)
        h = ops.relu(ops.batch_norm(h, g, b, None, None, training=True))
        h = ops.max_pool2d(h, 2, 2)
        h = ops.add(h, ops.max_pool2d(h, 3, 1, 1))
        return ops.softmax_cross_entropy(ops.linear(ops.global_avg_pool(h), w2, b2), labels, 0.1)

    check_gradients(net, r.standard_normal((2, 4, 4, 2)), r.standard_normal((3, 3, 3, 2)),
                    1 + r.random(3), r.standard_normal(3), r.standard_normal((4, 3)), r.standard_normal(4),
                    rtol=1e-4, atol=1e-6)
