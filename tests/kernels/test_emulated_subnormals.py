"""Subnormal numbers (below 2^-126 ≈ 1.2e-38) on the CPU emulator as on a GPU: CuPy compiles with
-ftz=true, so fp32 arithmetic treats subnormal inputs as zero and flushes subnormal results
(minidl/kernels/loader.py), and the emulator runs kernel threads in the same mode. Conversions
(cvt.rn.bf16.f32) have no .ftz and keep them. So the SGD update, bit for bit NumPy's float32
reference on normal numbers, is bit for bit a NumPy model of flush-to-zero on subnormal ones,
and the bf16 casts stay exact."""
import numpy
import pytest

import oracle

SMALLEST_NORMAL = numpy.float32(2.0 ** -126)


def flush(x):
    """Subnormals to zero of the same sign, as .ftz does to inputs and results."""
    x = numpy.asarray(x, numpy.float32)
    return numpy.where(numpy.abs(x) < SMALLEST_NORMAL, numpy.copysign(numpy.float32(0), x), x).astype(numpy.float32)


def ftz(operation):
    return lambda a, b: flush(operation(flush(a), flush(b)))


FTZ = ftz(numpy.add), ftz(numpy.subtract), ftz(numpy.multiply)
IEEE = numpy.add, numpy.subtract, numpy.multiply


def sgd(w, g, u, lam, lr, m, s, nesterov, rate_inside, c, arithmetic):
    """kernels/sgd.cu's update, operation by operation, in float32 `arithmetic` (FTZ or IEEE)."""
    add, sub, mul = arithmetic
    d = mul(g, s)
    if lam is not None:
        d = add(d, mul(lam, w))
    if rate_inside:
        uk = add(mul(mul(u, c), m), mul(d, lr))
        step = uk
    else:
        uk = add(mul(u, m), d)
        step = mul(add(d, mul(m, uk)), lr) if nesterov else mul(uk, lr)
    return sub(w, step), uk


def tiny(rng, n):
    """A third subnormal, a third just above the smallest normal (products with a rate or the
    momentum underflow), a third ordinary; either sign."""
    subnormal = rng.integers(1, 1 << 23, n, dtype=numpy.uint32).view(numpy.float32)
    near = SMALLEST_NORMAL * rng.uniform(1, 64, n).astype(numpy.float32)
    ordinary = rng.standard_normal(n).astype(numpy.float32)
    values = numpy.choose(rng.integers(0, 3, n), [subnormal, near, ordinary]).astype(numpy.float32)
    return values * rng.choice(numpy.float32([-1, 1]), n)


@pytest.mark.parametrize("n", [1000, 1003], ids=["float4", "scalar"])
@pytest.mark.parametrize("form", ["plain", "nesterov", "rate-inside"])
def test_sgd_flushes_subnormals_as_the_gpu(emulated, n, form):
    rng = numpy.random.default_rng(n)
    w, g, u = (tiny(rng, n) for _ in range(3))
    lam = (rng.integers(0, 2, n) * 1e-4).astype(numpy.float32)
    lr, m, s, c = numpy.float32(0.1), numpy.float32(0.9), numpy.float32(0.25), numpy.float32(1.5)
    nesterov, rate_inside = form == "nesterov", form == "rate-inside"
    ours_w, ours_u = w.copy(), u.copy()
    emulated.sgd_momentum_update(ours_w, g, ours_u, lr, m, s, lam, nesterov, rate_inside, c)
    expected = sgd(w, g, u, lam, lr, m, s, nesterov, rate_inside, c, FTZ)
    for ours, theirs in zip((ours_w, ours_u), expected):
        numpy.testing.assert_array_equal(ours.view(numpy.uint32), theirs.view(numpy.uint32))
    ieee = sgd(w, g, u, lam, lr, m, s, nesterov, rate_inside, c, IEEE)
    differ = sum(int((a.view(numpy.uint32) != b.view(numpy.uint32)).sum()) for a, b in zip(expected, ieee))
    assert differ > n // 10, "the data should reach subnormals, where flushing changes the result"


def test_bf16_casts_keep_subnormals(emulated):
    rng = numpy.random.default_rng(5)
    values = rng.integers(1, 1 << 23, 4000, dtype=numpy.uint32).view(numpy.float32)  # every one subnormal
    values = values * rng.choice(numpy.float32([-1, 1]), values.size)
    bits = emulated.cast(values, numpy.uint16)
    numpy.testing.assert_array_equal(bits, oracle.bf16_bits_of(oracle.nearest_bf16(values)))
    assert (oracle.from_bf16(bits) != 0).mean() > 0.9, "bf16 subnormals flushed"
    back = emulated.cast(bits, numpy.float32)
    numpy.testing.assert_array_equal(back.view(numpy.uint32), bits.astype(numpy.uint32) << 16)
