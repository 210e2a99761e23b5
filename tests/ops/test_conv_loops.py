"""The NumPy reference convolution (im2col + matrix product, flipped kernels, col2im) against
the loop-level definition of minidl/ops/conv_loops.py, on tiny odd shapes that take every
path the reference chooses between: 1×1, square and non-square kernels, stride 1 and 2,
padding 0 to past the kernel, grad-input as a correlation and through col2im."""
import numpy as np
import pytest

from minidl.ops import conv, conv_loops

# (N, H, W, C, K, R, S, stride, padding)
SHAPES = [
    (2, 5, 7, 3, 4, 3, 3, 1, 1),  # stride 1, square: grad-input as a correlation of dy
    (1, 6, 5, 2, 3, 3, 3, 2, 1),  # stride 2: col2im
    (3, 4, 4, 5, 2, 1, 1, 1, 0),  # 1×1: no im2col
    (1, 7, 6, 3, 2, 1, 1, 2, 0),  # strided 1×1
    (2, 5, 6, 2, 3, 2, 3, 1, 0),  # non-square kernel
    (1, 5, 5, 1, 2, 3, 3, 1, 3),  # padding past the kernel
    (1, 9, 7, 3, 5, 5, 5, 3, 2),  # 5×5, stride 3
]


@pytest.mark.parametrize("n, h, w, c, k, r, s, stride, padding", SHAPES)
def test_reference_matches_the_loops(n, h, w, c, k, r, s, stride, padding):
    rng = np.random.default_rng(n * 100 + h * 10 + r)
    x = rng.standard_normal((n, h, w, c))
    weight = rng.standard_normal((k, r, s, c))
    y = conv.correlate(x, weight, stride, padding)
    np.testing.assert_allclose(y, conv_loops.forward(x, weight, stride, padding), rtol=1e-12, atol=1e-12)
    gy = rng.standard_normal(y.shape)
    gx_loops = conv_loops.grad_input(gy, weight, x.shape, stride, padding)
    gw_loops = conv_loops.grad_weight(x, gy, weight.shape, stride, padding)
    gx, gw = conv.grads(gy, x, weight, stride, padding)  # the path Conv2d.backward takes
    np.testing.assert_allclose(gx, gx_loops, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gw, gw_loops, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(conv.grad_input(gy, weight, x.shape, stride, padding), gx_loops, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(conv.grad_weight(x, gy, weight, stride, padding), gw_loops, rtol=1e-12, atol=1e-12)


def test_the_loops_are_the_adjoint_of_forward():
    """<dy, conv(x, w)> = <dx, x> = <dw, w>: the loops' gradients are those of their own forward."""
    rng = np.random.default_rng(3)
    x, weight = rng.standard_normal((1, 5, 4, 2)), rng.standard_normal((3, 3, 2, 2))
    y = conv_loops.forward(x, weight, 2, 1)
    gy = rng.standard_normal(y.shape)
    inner = np.vdot(gy, y)
    assert np.isclose(np.vdot(conv_loops.grad_input(gy, weight, x.shape, 2, 1), x), inner, rtol=1e-12)
    assert np.isclose(np.vdot(conv_loops.grad_weight(x, gy, weight.shape, 2, 1), weight), inner, rtol=1e-12)
