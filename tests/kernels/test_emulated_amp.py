"""The bf16 kernels and the CUDA-graph form of the SGD update on the CPU emulator: float32 <-> bf16
casts bit for bit against an independent NumPy construction of round-to-nearest-even (and
against torch's bfloat16), the bf16 gradient sum, the update through device scalars, the bf16
copy of the weights that convolutions read, and the dtype policy's casts with a bf16 tensor read twice."""
import numpy
import pytest
import torch

import oracle
from minidl import Tensor, kernels, ops
from minidl.backend import BF16
from minidl.optim import LARS, SGD
from minidl.training.graph import GraphedStep
from test_emulated_ops import Recording


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


def test_a_step_without_a_device_half_is_refused_for_replay(emulated_gpu):
    """LARS has no device half of its step (stage_step / step_from_device): nothing would be
    staged for a replay, so a graph of it is refused; SGD's device half needs its staged scalars."""
    params = [Tensor(numpy.ones((4, 4), dtype=numpy.float32), requires_grad=True)]
    with pytest.raises(TypeError, match="cannot be replayed from a CUDA graph"):
        GraphedStep(lambda images, labels, staged: None, LARS(params, lr=0.1, align=8), (2, 4, 4, 3))
    sgd = SGD([Tensor(numpy.ones((4, 4), dtype=numpy.float32), requires_grad=True)], lr=0.1, align=8)
    with pytest.raises(RuntimeError, match="call it first"):
        sgd.step_from_device()


def test_convolution_reads_the_weights_through_the_bf16_copy(emulated_gpu):
    """The flat buffer's bf16 copy: each parameter's `.bf16` view holds its weights rounded to
    bf16 after a refresh (and keeps the old ones until then), and a convolution of bf16 data
    reads that view rather than casting the weight."""
    rng = numpy.random.default_rng(0)
    bias = Tensor(rng.standard_normal(3).astype(numpy.float32), requires_grad=True)  # shifts w off 16 bytes
    w = Tensor(rng.standard_normal((16, 3, 3, 8)).astype(numpy.float32), requires_grad=True)
    w_aligned = Tensor(rng.standard_normal((16, 3, 3, 8)).astype(numpy.float32), requires_grad=True)
    flat = SGD([w_aligned, bias, w], lr=0.1, align=8).flat
    flat.keep_bf16_copy()
    assert numpy.shares_memory(w_aligned.bf16, flat.bf16) and w.bf16 is None, \
        "a copy 2 bytes off 16-byte alignment cannot feed the tiles"
    flat.refresh_bf16_copy()
    assert numpy.array_equal(w_aligned.bf16, oracle.to_bf16(w_aligned.data))

    x = Tensor(oracle.to_bf16(rng.standard_normal((2, 5, 5, 8)).astype(numpy.float32)))
    recording = Recording(emulated_gpu)
    with kernels.use(recording, numpy.ndarray):
        y = ops.conv2d(x, w_aligned, stride=1, padding=1)
    assert "cast" not in recording.called, "the weight was cast instead of read from its bf16 copy"
    x64, w64 = (Tensor(oracle.from_bf16(a).astype(numpy.float64)) for a in (x.data, w_aligned.bf16))
    expected = ops.conv2d(x64, w64, stride=1, padding=1).data
    oracle.assert_close(oracle.from_bf16(y.data), expected, oracle.TOLERANCE["bf16"], "conv of bf16 data, bf16 copy")

    w_aligned.data[...] = 0  # an update; until the refresh the copy keeps the old weights, after it the new
    assert w_aligned.bf16.any()
    flat.refresh_bf16_copy()
    assert not w_aligned.bf16.any()


def test_casts_and_a_bf16_tensor_read_twice(emulated_gpu):
    """to_compute_dtype and to_float, with the bf16 tensor between them read by two operations
    (as a residual block's input): forward values, and the gradient that autograd sums in bf16."""
    rng = numpy.random.default_rng(0)
    x = Tensor(rng.standard_normal((3, 4, 5, 8)).astype(numpy.float32), requires_grad=True)
    g = rng.standard_normal(x.shape).astype(numpy.float32)
    y = ops.to_compute_dtype(x, BF16)
    assert y.dtype == BF16 and ops.to_compute_dtype(y, BF16) is y
    a, b = y, y
    z = ops.to_float(a) + ops.to_float(b)
    assert numpy.array_equal(z.data, 2 * oracle.from_bf16(oracle.to_bf16(x.data)))
    z.backward(g)
    # each branch's gradient is g rounded to bf16; their bf16 sum is exactly twice that
    assert x.grad.dtype == numpy.float32
    assert numpy.array_equal(x.grad.data, 2 * oracle.from_bf16(oracle.to_bf16(g)))
