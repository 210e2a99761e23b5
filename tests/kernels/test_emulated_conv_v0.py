"""The naive v0 convolution (kernels/conv_v0.cu), run by the CPU emulator, against the NumPy
reference in float64 on small odd shapes (strides 1 to 3, padding 0 to past the kernel,
non-square kernels, channel counts of 1 and 3, more outputs than one block has threads); and
the rule that the autotuner never offers it."""
import numpy
import pytest

import oracle
from minidl.backend import BF16
from minidl.kernels import conv_v0
from minidl.kernels.conv import conv_geometry
from minidl.kernels.conv_v2 import PASSES
from minidl.ops import conv

# N, H, W, C, K, R, S, stride, padding
SHAPES = {
    "3x3 s1, odd image": (2, 7, 6, 3, 5, 3, 3, 1, 1),
    "3x3 s2, batch 1": (1, 9, 8, 4, 6, 3, 3, 2, 1),
    "1x1 s2": (2, 7, 7, 5, 3, 1, 1, 2, 0),
    "7x7 s2 stem, C=3": (1, 11, 11, 3, 4, 7, 7, 2, 3),
    "2x3 kernel, no padding": (2, 5, 6, 2, 3, 2, 3, 1, 0),
    "5x5 s3, padding past the kernel": (1, 8, 7, 1, 2, 5, 5, 3, 5),
    "300 outputs per pass, two blocks": (3, 6, 6, 4, 10, 3, 3, 1, 1),
}


@pytest.mark.parametrize("case", SHAPES)
def test_v0_matches_the_reference(emulated, case):
    n, h, w, c, k, r, s, stride, padding = SHAPES[case]
    rng = numpy.random.default_rng(sum(SHAPES[case]))
    x = rng.standard_normal((n, h, w, c)).astype(numpy.float32)
    weight = rng.standard_normal((k, r, s, c)).astype(numpy.float32)
    x64, w64 = x.astype(numpy.float64), weight.astype(numpy.float64)
    y64 = conv.correlate(x64, w64, stride, padding)
    gy = rng.standard_normal(y64.shape).astype(numpy.float32)
    gy64 = gy.astype(numpy.float64)
    plan, tolerance = conv_v0.PLAN, oracle.TOLERANCE["fp32"]
    oracle.assert_close(emulated.conv_forward(x, weight, stride, padding, plan=plan), y64, tolerance, "v0 forward")
    oracle.assert_close(emulated.conv_grad_input(gy, weight, x.shape, stride, padding, plan=plan),
                        conv.grad_input(gy64, w64, x.shape, stride, padding), tolerance, "v0 grad-input")
    oracle.assert_close(emulated.conv_grad_weight(x, gy, weight.shape, stride, padding, plan=plan),
                        conv.grad_weight(x64, gy64, w64, stride, padding), tolerance, "v0 grad-weight")


def test_v0_takes_float32_only(emulated):
    x, weight = numpy.zeros((1, 4, 4, 8), BF16), numpy.zeros((8, 3, 3, 8), BF16)
    with pytest.raises(TypeError, match="float32 data only"):
        emulated.conv_forward(x, weight, 1, 1, plan=conv_v0.PLAN)


TUNED_SHAPES = [(2, 8, 8, 64, 64, 3, 3, 1, 1), (2, 15, 15, 3, 64, 7, 7, 2, 3), (4, 7, 7, 256, 128, 1, 1, 2, 0)]


@pytest.mark.parametrize("dtype, tf32, shape", [(dtype, tf32, shape) for dtype, tf32 in
                                                ((numpy.float32, True), (numpy.float32, False), (BF16, True))
                                                for shape in TUNED_SHAPES if dtype != BF16 or shape[3] % 8 == 0])
def test_the_autotuner_never_offers_v0(emulated, dtype, tf32, shape):
    """Every plan a tuner may choose (ConvKernels.plans) and the plan without a tuner are v1, v2 or v3."""
    n, h, w, c, k, r, s, stride, padding = shape
    geometry = conv_geometry((n, h, w, c), (k, r, s, c), stride, padding)
    previous, emulated.allow_tf32 = emulated.allow_tf32, tf32
    try:
        operands = (numpy.zeros((n, h, w, c), dtype), numpy.zeros((k, r, s, c), dtype))
        for conv_pass in PASSES:
            offered = emulated.plans(conv_pass, operands, geometry) + [emulated.v1_plan(conv_pass, operands, geometry)]
            assert {plan.version for plan in offered} <= {"v1", "v2", "v3"}, offered
    finally:
        emulated.allow_tf32 = previous


def test_the_benchmark_ladder_runs_every_rung(emulated):
    """`python -m minidl.bench kernels`'s ladder on the emulator, PyTorch on the CPU as the oracle:
    every rung of every pass agrees with PyTorch; v2, which runs only under an autotuner after its
    canary, is skipped without one (tests/gpu_check.sh --dry-run runs it with one)."""
    import torch
    from minidl.bench import kernels as bench
    rows = []

    def timer(function, torch_events=None):
        function()
        return 1.0
    previous, bench.DEVICE = bench.DEVICE, "cpu"
    try:
        bench.bench_ladder(emulated, numpy, torch, timer, 2, rows, lambda batch: {"1x1": bench.small_convs(batch)["small 1x1"]})
    finally:
        bench.DEVICE = previous
    assert not [r for r in rows if "error" in r]
    assert [r["op"] for r in rows if "skipped" in r] == ["ladder v2 fwd", "ladder v2 dgrad", "ladder v2 wgrad"]
    measured = {(r["op"], r["mode"]): r["max_error_vs_torch"] for r in rows if "skipped" not in r}
    assert len(measured) == 3 * 3
    for (op, mode), error in measured.items():
        assert error < (2e-3 if mode == "tf32" else 1e-5), (op, mode, error)
