"""Checks of each kernel operation against minidl's reference ops, shared by the CPU-emulation
tests (small and odd shapes, NumPy) and the GPU tests (ResNet-50 shapes, CuPy).

The oracle is always the reference path of minidl.ops in float64, on the values the kernel
actually received: the bf16-rounded values for bf16, the fp32 values otherwise (the TF32
rounding inside the tensor cores is part of the error being bounded). A check compares the
largest error with the largest reference magnitude:

    max |kernel − reference| / max |reference|  <=  TOLERANCE[mode]

fp32    exact fp32 arithmetic, only the summation order differs: 1e-4 covers fp32 accumulation
        over the longest reduction (about 6e-8·√(401k pixels) ≈ 4e-5 for the stem's grad-weight)
tf32    operands rounded to 10 mantissa bits (relative 2^-11 each): errors of about 2^-11/3
        ≈ 2e-4 are typical, 5e-3 leaves a margin of 20 and is far below what a wrong index gives
bf16    operands exact in bf16 (the reference sees the same values), products exact in fp32, the
        output rounded to 8 mantissa bits (2^-9 ≈ 2e-3 of the largest value): 1.5e-2
SGD     bit-exact: the kernel performs NumPy's float32 operations in NumPy's order
casts   bit-exact against `nearest_bf16`, an independent float64 construction of round-to-nearest-even

Arrays are created on the host and copied with `xp.array` (a copy on NumPy too), so the
emulation and the GPU see the same numbers for the same seed and never share memory with the
reference.
"""
import numpy

from minidl import Tensor, ops
from minidl.backend import to_numpy
from minidl.kernels.autotune import REFERENCE_TOLERANCE
from minidl.ops import conv as conv_ref
from minidl.ops.loss import SoftmaxCrossEntropy
from minidl.ops.norm import BatchNorm
from minidl.ops.pool import GlobalAvgPool, MaxPool2d
from minidl.ops.sgd import sgd_momentum_update

TOLERANCE = REFERENCE_TOLERANCE  # the table above, declared in the product (the standalone programs check with it)


def to_bf16(values):
    """float32 -> bfloat16 bits (uint16), rounding to nearest even like __float2bfloat16."""
    bits = numpy.ascontiguousarray(values, dtype=numpy.float32).view(numpy.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(numpy.uint16)


def from_bf16(bits):
    return (numpy.asarray(bits).astype(numpy.uint32) << 16).view(numpy.float32)


def assert_close(actual, expected, tolerance, what):
    actual, expected = to_numpy(actual).astype(numpy.float64), to_numpy(expected).astype(numpy.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert numpy.isfinite(actual).all(), f"{what}: non-finite values"
    scale = max(float(numpy.abs(expected).max(initial=0.0)), 1e-30)
    error = float(numpy.abs(actual - expected).max(initial=0.0)) / scale
    assert error <= tolerance, f"{what}: max error {error:.2e} of the largest value, tolerance {tolerance:.0e}"
    return error


class Inputs:
    """Random host data in one mode: `.kernel(a)` is what the kernel gets (float32 or bf16
    bits on xp), `.reference(a)` the same values in float64 on xp, `.result(a)` a kernel
    output as float64."""

    def __init__(self, xp, mode, seed):
        self.xp, self.mode, self.rng = xp, mode, numpy.random.default_rng(seed)

    def normal(self, shape, scale=1.0, offset=0.0):
        values = (offset + scale * self.rng.standard_normal(shape)).astype(numpy.float32)
        return to_bf16(values) if self.mode == "bf16" else values

    def kernel(self, host):
        return self.xp.array(host)  # a copy, also on NumPy: the host array stays the reference's

    def reference(self, host):
        values = from_bf16(host) if host.dtype == numpy.uint16 else host
        return self.xp.asarray(values.astype(numpy.float64))

    def result(self, array):
        host = to_numpy(array)
        return from_bf16(host) if host.dtype == numpy.uint16 else host


# ---- convolution ------------------------------------------------------------------------------

def check_conv(kernels, xp, mode, n, h, w, c, k, r, stride, padding, seed=0, tile=None, every_plan=False, keep=None):
    """Forward, grad-input and grad-weight of one convolution; `tile` asserts which conv.cu tile
    runs without a tuner; `every_plan` checks every kernel plan of each pass (v1, each v2 and v3
    tile and split that fits) that `keep(conv_pass, plan)` accepts (None: all), not only the one
    the autotuner (or its absence) picks."""
    data = Inputs(xp, mode, seed)
    x, wt = data.normal((n, h, w, c)), data.normal((k, r, r, c), scale=(r * r * c) ** -0.5)
    previous, kernels.allow_tf32 = kernels.allow_tf32, mode == "tf32"
    try:
        if tile is not None:
            assert kernels.conv_tile(x.dtype, c, k).name == tile
        x64, w64 = data.reference(x), data.reference(wt)
        expected_y = conv_ref.correlate(x64, w64, stride, padding)
        gy = data.normal(expected_y.shape)
        gy64 = data.reference(gy)
        geometry = (n, h, w, c, k, r, r, *expected_y.shape[1:3], stride, padding)
        passes = {  # operands, run(plan), expected
            "conv_fwd": ((x, wt), lambda a, b, plan: kernels.conv_forward(a, b, stride, padding, plan=plan),
                         expected_y),
            "conv_dgrad": ((gy, wt), lambda a, b, plan: kernels.conv_grad_input(a, b, x.shape, stride, padding,
                                                                                plan=plan),
                           conv_ref.grad_input(gy64, w64, x.shape, stride, padding)),
            "conv_wgrad": ((x, gy), lambda a, b, plan: kernels.conv_grad_weight(a, b, wt.shape, stride, padding,
                                                                                plan=plan),
                           conv_ref.grad_weight(x64, gy64, w64, stride, padding))}
        checked = []
        for conv_pass, (operands, run, expected) in passes.items():
            operands = [data.kernel(a) for a in operands]
            plans = [p for p in kernels.plans(conv_pass, operands, geometry) if keep is None or keep(conv_pass, p)] \
                if every_plan else [None]
            for plan in plans:
                out = run(*operands, plan)
                if conv_pass == "conv_wgrad":
                    assert out.dtype == numpy.float32
                # fp32 accumulation: the bf16 tolerance is set by the output rounding, which wgrad does not have
                assert_close(data.result(out), expected, TOLERANCE[mode],
                             f"{conv_pass} {mode} {plan.label() if plan else 'as chosen'}")
                checked.append(plan.label() if plan else "as chosen")
        return {"plans": checked}
    finally:
        kernels.allow_tf32 = previous


# ---- batch norm -------------------------------------------------------------------------------

def check_batch_norm(kernels, xp, mode, shape, training=True, fused=None, seed=0, offset=0.0):
    """BN forward (and running statistics) and backward, plain or fused: fused = "relu" or
    "add_relu". The reference is BatchNorm + relu (+ add) in float64 through autograd; for the
    backward the kernel's own output decides the ReLU mask (y > 0), so a value that is zero in
    one precision and not the other cannot make the check flaky."""
    data = Inputs(xp, mode, seed)
    channels = shape[-1]
    x = data.normal(shape, offset=offset)
    gamma = data.rng.uniform(0.5, 1.5, channels).astype(numpy.float32)
    beta = data.rng.uniform(-0.5, 0.5, channels).astype(numpy.float32)
    running = [data.rng.uniform(-0.2, 0.2, channels).astype(numpy.float32),
               data.rng.uniform(0.5, 2.0, channels).astype(numpy.float32)]
    residual = data.normal(shape) if fused == "add_relu" else None
    tol = TOLERANCE["bf16" if mode == "bf16" else "fp32"]

    kernel_running = [xp.array(a) for a in running]
    y, saved = kernels.batch_norm_forward(data.kernel(x), xp.asarray(gamma), xp.asarray(beta), *kernel_running,
                                          training, 0.1, 1e-5, None if residual is None else data.kernel(residual),
                                          relu=fused is not None)
    ref_running = [xp.asarray(a.astype(numpy.float64)) for a in running]
    function = BatchNorm(*ref_running, training, 0.1, 1e-5)
    ref_x = Tensor(data.reference(x), requires_grad=True)
    ref_gamma, ref_beta = (Tensor(xp.asarray(a.astype(numpy.float64)), requires_grad=True) for a in (gamma, beta))
    ref_y = function(ref_x, ref_gamma, ref_beta)
    if residual is not None:
        ref_residual = Tensor(data.reference(residual), requires_grad=True)
        ref_y = ref_y + ref_residual
    if fused is not None:
        ref_y = ops.relu(ref_y)
    assert_close(data.result(y), ref_y.data, tol, f"batch norm forward {mode} {fused or ''}")
    for name, ours, theirs in zip(("running mean", "running var"), kernel_running, ref_running):
        assert_close(ours, theirs, TOLERANCE["fp32"], f"batch norm {name}")

    gy = data.normal(shape)
    gx, ggamma, gbeta, gresidual = kernels.batch_norm_backward(data.kernel(gy), data.kernel(x), saved, training,
                                                               y=y if fused else None,
                                                               residual_grad=residual is not None)
    mask = data.result(y) > 0 if fused else numpy.ones(shape, dtype=bool)
    gradient = data.reference(gy) * xp.asarray(mask)
    bn_out = function(ref_x, ref_gamma, ref_beta)  # a fresh graph: the BN alone, fed the masked gradient
    bn_out.backward(gradient)
    assert_close(data.result(gx), ref_x.grad.data, tol, f"batch norm grad-input {mode} {fused or ''}")
    assert_close(ggamma, ref_gamma.grad.data, tol, f"batch norm grad-gamma {mode}")
    assert_close(gbeta, ref_beta.grad.data, tol, f"batch norm grad-beta {mode}")
    if residual is not None:
        assert_close(data.result(gresidual), gradient, tol, "batch norm grad-residual")


# ---- pooling, loss, SGD -----------------------------------------------------------------------

def check_max_pool(kernels, xp, shape, kernel, stride, padding, seed=0, levels=None):
    """`levels`: draw from that many distinct values, so that windows hold ties (zeros after a
    ReLU do): the gradient must go to the first maximum in (r, s) order, as in the reference."""
    rng = numpy.random.default_rng(seed)
    x = (rng.integers(0, levels, shape) if levels else rng.standard_normal(shape)).astype(numpy.float32)
    y, argmax = kernels.max_pool_forward(xp.asarray(x), kernel, stride, padding)
    function = MaxPool2d(kernel, stride, padding)
    ref_y = function.forward(x)
    assert (to_numpy(y) == ref_y).all(), "max pool forward differs"
    gy = rng.standard_normal(ref_y.shape).astype(numpy.float32)
    gx = kernels.max_pool_backward(xp.asarray(gy), argmax, x.shape, kernel, stride, padding)
    assert_close(gx, function.backward(gy.astype(numpy.float64)), TOLERANCE["fp32"], "max pool backward")


def check_global_avg_pool(kernels, xp, shape, seed=0):
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(numpy.float32)
    function = GlobalAvgPool()
    assert_close(kernels.global_avg_pool_forward(xp.asarray(x)), function.forward(x.astype(numpy.float64)),
                 TOLERANCE["fp32"], "global average pool forward")
    gy = rng.standard_normal((shape[0], shape[-1])).astype(numpy.float32)
    gx = kernels.global_avg_pool_backward(xp.asarray(gy), shape)
    assert (to_numpy(gx) == function.backward(gy)).all(), "global average pool backward differs"


def check_softmax_xent(kernels, xp, n, classes, smoothing, seed=0, scale=1.0):
    rng = numpy.random.default_rng(seed)
    logits = (scale * rng.standard_normal((n, classes))).astype(numpy.float32)
    labels = rng.integers(0, classes, n)
    loss, grad = kernels.softmax_cross_entropy(xp.asarray(logits), xp.asarray(labels), smoothing)
    function = SoftmaxCrossEntropy(labels, smoothing)
    ref_loss = function.forward(logits.astype(numpy.float64))
    assert_close(loss, ref_loss, TOLERANCE["fp32"], "softmax cross-entropy loss")
    assert_close(grad, function.backward(numpy.float64(1.0)), TOLERANCE["fp32"], "softmax cross-entropy gradient")


def check_sgd(kernels, xp, n, nesterov, decay, steps=3, seed=0, offset=0, rate_inside=False):
    """Several steps of the kernel against sgd_momentum_update on the host: bit for bit.
    `offset` elements into a larger buffer: a view that is not 16-byte aligned. The rate
    changes every step (so the rate-inside form's momentum correction is exercised)."""
    rng = numpy.random.default_rng(seed)
    w, u = (rng.standard_normal(n + offset).astype(numpy.float32) for _ in range(2))
    rates = (rng.integers(0, 2, n + offset) * 1e-4).astype(numpy.float32) if decay else None
    on_device = [xp.array(a) if a is not None else None for a in (w, u, rates)]
    views = [a[offset:] if a is not None else None for a in on_device]
    w, u, rates = (a[offset:] if a is not None else None for a in (w, u, rates))
    for step in range(steps):
        g = rng.standard_normal(n).astype(numpy.float32)
        lr, correction = 0.1 * (step + 1), (step + 1) / step if step else 1.0
        form = dict(rate_inside=rate_inside, velocity_scale=correction)
        kernels.sgd_momentum_update(views[0], xp.asarray(g), views[1], lr, 0.9, 0.25, views[2], nesterov, **form)
        sgd_momentum_update(w, g, u, lr, 0.9, 0.25, rates, nesterov, **form)
        assert numpy.array_equal(to_numpy(views[0]), w), f"SGD step {step}: weights differ"
        assert numpy.array_equal(to_numpy(views[1]), u), f"SGD step {step}: momentum differs"



def check_sgd_scalars(kernels, xp, n, rate_inside, steps=3, seed=0):
    """The update through device scalars (what a CUDA graph replays): store_sgd_scalars stores the
    step's rate, gradient scale and momentum correction, sgd_momentum_update_from updates with
    them. Bit for bit the plain update (check_sgd: the reference's), the rate changing every step."""
    rng = numpy.random.default_rng(seed)
    w, u = (rng.standard_normal(n).astype(numpy.float32) for _ in range(2))
    rates = xp.asarray((rng.integers(0, 2, n) * 1e-4).astype(numpy.float32))
    through_scalars, plain = [xp.array(w), xp.array(u)], [xp.array(w), xp.array(u)]
    scalars = xp.zeros(3, dtype=numpy.float32)
    for step in range(steps):
        g = xp.asarray(rng.standard_normal(n).astype(numpy.float32))
        lr, correction = 0.1 * (step + 1), (step + 1) / step if step else 1.0
        kernels.store_sgd_scalars(scalars, lr, 0.25, correction)
        assert numpy.array_equal(to_numpy(scalars), numpy.float32([lr, 0.25, correction])), "stored scalars"
        assert numpy.array_equal(to_numpy(through_scalars[0]), to_numpy(plain[0])), "storing changed the weights"
        kernels.sgd_momentum_update_from(scalars, through_scalars[0], g, through_scalars[1], 0.9, rates, False,
                                         rate_inside)
        kernels.sgd_momentum_update(plain[0], g, plain[1], lr, 0.9, 0.25, rates, False, rate_inside, correction)
        for name, ours, theirs in zip(("weights", "momentum"), through_scalars, plain):
            assert numpy.array_equal(to_numpy(ours), to_numpy(theirs)), f"SGD through scalars, step {step}: {name}"


# ---- bf16 casts and sums (kernels/amp.cu) -----------------------------------------------------

BF16_MAX = (2 - 2 ** -7) * 2.0 ** 127


def nearest_bf16(values):
    """The bf16 value nearest to each value (float32 or float64), ties to the even mantissa, as
    float64: built from the spacing of bf16 numbers (2^(e-7) around 2^e, 2^-133 below 2^-126)
    with float64 arithmetic, sharing nothing with the bit trick of `to_bf16`."""
    with numpy.errstate(invalid="ignore"):  # a signaling NaN raises the flag in the conversion
        x = numpy.asarray(values, dtype=numpy.float64)
    magnitude = numpy.abs(x)
    _, exponent = numpy.frexp(magnitude)  # magnitude = m·2^exponent, m in [0.5, 1)
    spacing = numpy.ldexp(1.0, numpy.maximum(exponent - 1, -126) - 7)
    finite = numpy.isfinite(x) & (magnitude > 0)
    steps = numpy.where(finite, magnitude / numpy.where(finite, spacing, 1.0), 0.0)  # exact: a power of two
    lower = numpy.floor(steps)
    fraction = steps - lower
    up = (fraction > 0.5) | ((fraction == 0.5) & (lower % 2 == 1))
    rounded = (lower + up) * spacing
    rounded = numpy.where(rounded > BF16_MAX, numpy.inf, rounded)
    return numpy.where(finite, numpy.copysign(rounded, x), x)  # zeros, infinities and NaN unchanged


def bf16_bits_of(values):
    """The bits of float64 values that are bf16 numbers (or ±inf, NaN)."""
    return (numpy.asarray(values, dtype=numpy.float32).view(numpy.uint32) >> 16).astype(numpy.uint16)


def cast_test_values(n, seed=0):
    """float32 values that test a rounding: zeros, subnormals, ties at both parities, the edges of
    overflow, infinities, NaN, and random bit patterns over the whole range."""
    rng = numpy.random.default_rng(seed)
    tie = numpy.uint32(0x8000)
    bits = numpy.array([0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00008000, 0x00018000, 0x3F808000,
                        0x3F818000, 0xBF808000, 0x3F807FFF, 0x3F808001, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF,
                        0xFF7F8000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF], dtype=numpy.uint32)
    ties = (rng.integers(0, 1 << 16, 64, dtype=numpy.uint32) << 16) | tie
    random = rng.integers(0, 1 << 32, n, dtype=numpy.uint32)
    return numpy.concatenate([bits, ties, random]).view(numpy.float32)


def check_casts(kernels, xp, n=5000, seed=0):
    """float32 -> bf16 bit for bit against nearest_bf16 (NaN: still a NaN), and bf16 -> float32 exact."""
    values = cast_test_values(n, seed)
    bits = to_numpy(kernels.cast(xp.asarray(values), numpy.uint16))
    assert bits.dtype == numpy.uint16
    expected = nearest_bf16(values)
    nan = numpy.isnan(values)
    assert numpy.isnan(from_bf16(bits[nan])).all(), "a NaN did not stay a NaN"
    wrong = numpy.flatnonzero(bits[~nan] != bf16_bits_of(expected[~nan]))
    assert wrong.size == 0, (f"float32 -> bf16 differs at {wrong.size} values, e.g. {values[~nan][wrong[0]]!r} -> "
                             f"{bits[~nan][wrong[0]]:#06x}, {bf16_bits_of(expected[~nan])[wrong[0]]:#06x} expected")
    back = to_numpy(kernels.cast(xp.asarray(bits), numpy.float32))
    assert back.dtype == numpy.float32
    assert numpy.array_equal(back.view(numpy.uint32), bits.astype(numpy.uint32) << 16), "bf16 -> float32 is not exact"


def check_bf16_add(kernels, xp, n=5000, seed=0):
    """a + b of bf16 arrays: the nearest bf16 to the exact sum (exact in float64 at these scales)."""
    rng = numpy.random.default_rng(seed)
    scales = 10.0 ** rng.uniform(-3, 3, (2, n))
    a, b = (to_bf16((scale * rng.standard_normal(n)).astype(numpy.float32)) for scale in scales)
    b[:100] = to_bf16(-from_bf16(a[:100]))  # exact cancellations
    total = to_numpy(kernels.bf16_add(xp.asarray(a), xp.asarray(b)))
    expected = bf16_bits_of(nearest_bf16(from_bf16(a).astype(numpy.float64) + from_bf16(b)))
    assert numpy.array_equal(total, expected), f"bf16 sums differ at {int((total != expected).sum())} of {n}"
