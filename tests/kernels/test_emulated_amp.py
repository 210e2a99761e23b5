"""The bf16 kernels and the CUDA-graph form of the SGD update on the CPU emulator: float32 <-> bf16
casts bit for bit against an independent NumPy construction of round-to-nearest-even (and
against torch's bfloat16), the bf16 gradient sum, the update through device scalars, the bf16
copy of the weights that convolutions read, and the dtype policy's casts with a bf16 tensor read twice."""
import numpy
import pytest
import torch

import oracle
from minidl import Tensor, ops
from minidl.backend import BF16, autocast
from minidl.optim import LARS


def test_nearest_bf16_agrees_with_torch():
    """The NumPy reference itself, against torch's float32 -> bfloat16 conversion (NaN aside)."""
    values = oracle.cast_test_values(20000, seed=1)
    finite = ~numpy.isnan(values)
    theirs = torch.from_numpy(values[finite]).to(torch.bfloat16).view(torch.int16).numpy().view(numpy.uint16)
    assert numpy.array_equal(oracle.bf16_bits_of(oracle.nearest_bf16(values[finite])), theirs)


def test_casts(emulated):
    oracle.check_casts(emulated, numpy)


def test_bf16_add(emulated):
    oracle.check_bf16_add(emulated, numpy)


@pytest.mark.parametrize("n, rate_inside", [(1000, False), (1003, True)])  # float4 path, scalar path
def test_sgd_through_device_scalars(emulated, n, rate_inside):
    oracle.check_sgd_scalars(emulated, numpy, n, rate_inside)


def test_sgd_scalars_refuses_an_update_it_cannot_replay(emulated_gpu):
    """LARS updates without sgd_momentum_update: nothing would be stored for a replay."""
    params = [Tensor(numpy.ones((4, 4), dtype=numpy.float32), requires_grad=True)]
    optimizer = LARS(params, lr=0.1, align=8)
    scalars = numpy.zeros(3, dtype=numpy.float32)
    with pytest.raises(RuntimeError, match="one SGD update was expected"):
        with emulated_gpu.sgd_scalars(scalars, launch=False):
            optimizer.step()
    with pytest.raises(RuntimeError, match="does not nest"):
        with emulated_gpu.sgd_scalars(scalars, launch=True), emulated_gpu.sgd_scalars(scalars, launch=True):
            pass


def test_convolution_reads_the_weights_through_the_shadow(emulated):
    rng = numpy.random.default_rng(0)
    flat = rng.standard_normal(8 + 16 * 3 * 3 * 8).astype(numpy.float32)
    w = flat[8:].reshape(16, 3, 3, 8)  # a parameter: a view into the flat buffer, 32 bytes in
    shadow = emulated.bf16_shadow(flat)
    assert emulated.bf16_shadow(flat) is shadow, "one shadow per buffer"
    shadow.refresh()
    view = emulated.weight_like(numpy.empty(1, dtype=BF16), w)
    assert numpy.shares_memory(view, shadow.bits) and numpy.array_equal(view, oracle.to_bf16(w))
    assert shadow.view_of(flat[1:9]) is None, "a copy 2 bytes off 16-byte alignment cannot feed the tiles"
    assert not numpy.shares_memory(emulated.weight_like(numpy.empty(1, dtype=BF16), w.copy()), shadow.bits)

    x = oracle.to_bf16(rng.standard_normal((2, 5, 5, 8)).astype(numpy.float32))
    y = emulated.conv_forward(x, w, 1, 1)
    x64, w64 = (Tensor(oracle.from_bf16(a).astype(numpy.float64)) for a in (x, view))
    expected = ops.conv2d(x64, w64, stride=1, padding=1).data
    oracle.assert_close(oracle.from_bf16(y), expected, oracle.TOLERANCE["bf16"], "conv of bf16 data, float32 weight")

    w[...] = 0  # an update; until the refresh the shadow keeps the old weights, after it the new
    assert view.any()
    shadow.refresh()
    assert not view.any()


def test_casts_and_a_bf16_tensor_read_twice(emulated_gpu):
    """to_compute_dtype and to_float, with the bf16 tensor between them read by two operations
    (as a residual block's input): forward values, and the gradient that autograd sums in bf16."""
    rng = numpy.random.default_rng(0)
    x = Tensor(rng.standard_normal((3, 4, 5, 8)).astype(numpy.float32), requires_grad=True)
    g = rng.standard_normal(x.shape).astype(numpy.float32)
    with autocast():
        y = ops.to_compute_dtype(x)
    assert y.dtype == BF16 and ops.to_compute_dtype(y) is y
    a, b = y, y
    z = ops.to_float(a) + ops.to_float(b)
    assert numpy.array_equal(z.data, 2 * oracle.from_bf16(oracle.to_bf16(x.data)))
    z.backward(g)
    # each branch's gradient is g rounded to bf16; their bf16 sum is exactly twice that
    assert x.grad.dtype == numpy.float32
    assert numpy.array_equal(x.grad.data, 2 * oracle.from_bf16(oracle.to_bf16(g)))
