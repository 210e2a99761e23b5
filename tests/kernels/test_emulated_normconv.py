"""The convolutions fused with batch norm (kernels/conv_v2_norm.cuh, minidl/kernels/normconv.py) on
the CPU emulator, every plan of every fused pass (the v1 composition and each v2 tile that fits)
against float64 references written here from the definitions:

    forward      y = conv(relu(x·scale_g + shift_g), w), and per statistics group g the mean and
                 biased variance of y
    grad-input   through relu(bn(x)): the batch norm's dL/dx, dγ, dβ from the convolution's dL/dz
    grad-weight  conv's dL/dw with relu(x·scale_g + shift_g) as its input
    block end    relu(bn(y) + r), r the residual or bn'(residual), and its backward

on shapes that divide no tile (odd spatial sizes, channels past a tile's edge), statistics
groups whose rows straddle the blocks' tiles (ghost batch norm of 1 and 2 images), strides 1
and 2, 1×1 and 3×3 filters. scale, shift and the batch statistics are the kernel's inputs and
the reference's alike (float32 values); bf16 kernels round scale and shift to bf16 for
fma.rn.relu.bf16x2, inside the bf16 tolerance.
"""
import numpy
import pytest

import oracle
from minidl.kernels import conv_v2
from minidl.kernels.autotune import Plan
from minidl.kernels.batchnorm import NORM, NORM_FIELDS
from minidl.kernels.conv_v2 import DRELU, NORMALIZE, STATS, Fusion
from minidl.kernels.normconv import group_slices
from minidl.ops import conv as conv_ref

EPS, MOMENTUM = 1e-5, 0.1
# (mode, n, h, w, c, k, r, stride, padding, images per group)
CASES = [("bf16", 4, 7, 5, 64, 72, 3, 1, 1, 2),   # 98 rows a group: every block holds part of one
         ("bf16", 4, 7, 6, 72, 64, 3, 2, 1, 1),   # grad-input over 4 phases, groups of one image
         ("bf16", 2, 6, 5, 64, 128, 1, 2, 0, 2),  # a 1×1 projection, one group
         ("bf16", 2, 23, 23, 16, 64, 3, 2, 1, 1),  # phases of 12×12 and 11×11: a block of no rows
         ("tf32", 2, 5, 7, 32, 36, 3, 1, 1, 1),
         ("tf32", 2, 5, 7, 36, 32, 3, 2, 1, 1)]
IDS = ["x".join(map(str, case)) for case in CASES]


class Case:
    """Random data of one case: x (the batch norm's input), its per-group batch statistics and
    the norm array built from them, w, the gradient reaching the convolution's output."""

    def __init__(self, mode, n, h, w, c, k, r, stride, padding, images, seed=0):
        self.mode, self.stride, self.padding, self.images = mode, stride, padding, images
        self.data = data = oracle.Inputs(numpy, mode, seed)
        self.x = data.normal((n, h, w, c), offset=0.3)
        self.w = data.normal((k, r, r, c), scale=(r * r * c) ** -0.5)
        self.gamma = data.rng.uniform(0.5, 1.5, c).astype(numpy.float32)
        self.beta = data.rng.uniform(-0.5, 0.5, c).astype(numpy.float32)
        self.x64, self.w64 = data.reference(self.x), data.reference(self.w)
        self.groups = group_slices(n, images)
        norm = numpy.zeros((len(self.groups), len(NORM_FIELDS), c), numpy.float32)
        for g, part in enumerate(self.groups):
            rows = self.x64[part].reshape(-1, c)
            mean, var = rows.mean(axis=0), rows.var(axis=0)
            inv_std = 1.0 / numpy.sqrt(var + EPS)
            norm[g, NORM["mean"]], norm[g, NORM["inv_std"]] = mean, inv_std
            norm[g, NORM["scale"]] = self.gamma * inv_std
            norm[g, NORM["shift"]] = self.beta - mean * norm[g, NORM["scale"]]
        self.norm = norm
        self.z64 = self.normalized(self.x64)
        self.y64 = conv_ref.correlate(self.z64, self.w64, stride, padding)
        self.gy = data.normal(self.y64.shape)
        self.gy64 = data.reference(self.gy)
        self.geometry = (n, h, w, c, k, r, r, *self.y64.shape[1:3], stride, padding)

    def normalized(self, x64, relu=True):
        out = numpy.empty_like(x64)
        for g, part in enumerate(self.groups):
            out[part] = x64[part] * self.norm[g, NORM["scale"]] + self.norm[g, NORM["shift"]]
        return numpy.maximum(out, 0.0) if relu else out

    def norm_backward(self, g64):
        """(dL/dx, dγ, dβ) of batch norm from dL/d(bn(x)), per group, dγ and dβ summed."""
        gx, ggamma, gbeta = numpy.empty_like(g64), 0.0, 0.0
        for g, part in enumerate(self.groups):
            gg = g64[part].reshape(-1, g64.shape[-1])
            xhat = (self.x64[part].reshape(gg.shape) - self.norm[g, NORM["mean"]]) * self.norm[g, NORM["inv_std"]]
            ggamma, gbeta = ggamma + (gg * xhat).sum(axis=0), gbeta + gg.sum(axis=0)
            dx = self.norm[g, NORM["scale"]] * (gg - gg.mean(axis=0) - xhat * (gg * xhat).mean(axis=0))
            gx[part] = dx.reshape(g64[part].shape)
        return gx, ggamma, gbeta

    def tolerance(self):
        return oracle.TOLERANCE[self.mode]

    def plans(self, gpu, conv_pass, fusion, operands):
        plans = gpu.fused_plans(conv_pass, fusion, operands, self.geometry)
        assert plans[0].version == "v1", "the composition of the existing kernels is always a candidate"
        return plans


def serves(case, conv_pass):
    """Whether some v2 tile computes this pass of the case (its reduction a multiple of BK)."""
    dtype = case.x.dtype
    return any(tile.fits(conv_pass, dtype, case.geometry) for tile in conv_v2.TILES.values())


@pytest.fixture
def tf32_allowed(emulated):
    previous, emulated.allow_tf32 = emulated.allow_tf32, True
    yield emulated
    emulated.allow_tf32 = previous


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_normalized_with_statistics(tf32_allowed, case):
    gpu, c = tf32_allowed, Case(*case)
    fusion = Fusion(NORMALIZE | STATS, c.norm, None, c.images)
    checked = []
    for plan in c.plans(gpu, "conv_fwd", fusion, (c.x, c.w)):
        y, stats = gpu.conv_forward_fused(c.data.kernel(c.x), c.data.kernel(c.w), c.stride, c.padding, norm=c.norm,
                                          images=c.images, stats=True, plan=plan)
        what = f"{plan.label()} forward"
        oracle.assert_close(c.data.result(y), c.y64, c.tolerance(), what)
        ours = c.data.result(y).astype(numpy.float64)  # the statistics are of the output as stored
        assert stats.shape == (len(c.groups), 2, y.shape[-1])
        for g, part in enumerate(c.groups):
            rows = ours[part].reshape(-1, y.shape[-1])
            oracle.assert_close(stats[g, 0], rows.mean(axis=0), 1e-5, f"{what}: group {g} mean")
            oracle.assert_close(stats[g, 1], rows.var(axis=0), 1e-5, f"{what}: group {g} variance")
        checked.append(plan.version)
    assert ("v2" in checked) == serves(c, "conv_fwd")


@pytest.mark.parametrize("case", CASES[:1], ids=IDS[:1])
def test_forward_statistics_of_a_plain_convolution_and_an_evaluation_norm(emulated, case):
    """STATS alone (the chain's first convolution), NORMALIZE alone (evaluation: one group of
    the running statistics over the whole batch)."""
    c = Case(*case)
    y_plain = conv_ref.correlate(c.x64, c.w64, c.stride, c.padding)
    for plan in c.plans(emulated, "conv_fwd", Fusion(STATS, None, None, c.images), (c.x, c.w)):
        y, stats = emulated.conv_forward_fused(c.data.kernel(c.x), c.data.kernel(c.w), c.stride, c.padding,
                                               images=c.images, stats=True, plan=plan)
        oracle.assert_close(c.data.result(y), y_plain, c.tolerance(), f"{plan.label()} stats only")
        ours = c.data.result(y).astype(numpy.float64)
        oracle.assert_close(stats[1, 1], ours[c.groups[1]].reshape(-1, y.shape[-1]).var(axis=0), 1e-5,
                            f"{plan.label()} stats only: variance")
    evaluation = c.norm[:1]  # one norm for every image
    expected = conv_ref.correlate(numpy.maximum(c.x64 * evaluation[0, NORM["scale"]] + evaluation[0, NORM["shift"]], 0),
                                  c.w64, c.stride, c.padding)
    n = len(c.x)
    for plan in c.plans(emulated, "conv_fwd", Fusion(NORMALIZE, evaluation, None, n), (c.x, c.w)):
        y, stats = emulated.conv_forward_fused(c.data.kernel(c.x), c.data.kernel(c.w), c.stride, c.padding,
                                               norm=evaluation, images=n, plan=plan)
        assert stats is None
        oracle.assert_close(c.data.result(y), expected, c.tolerance(), f"{plan.label()} evaluation norm")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grad_input_through_the_batch_norm(tf32_allowed, case):
    gpu, c = tf32_allowed, Case(*case)
    gz64 = conv_ref.grad_input(c.gy64, c.w64, c.x.shape, c.stride, c.padding)
    masked64 = gz64 * (c.normalized(c.x64, relu=False) > 0)
    expected = c.norm_backward(masked64)
    fusion = Fusion(DRELU, c.norm, c.x, c.images)
    checked = []
    for plan in c.plans(gpu, "conv_dgrad", fusion, (c.gy, c.w)):
        x = c.data.kernel(c.x)
        g, sums, relu_output = gpu.conv_grad_input_fused(c.data.kernel(c.gy), c.data.kernel(c.w), x, c.norm, c.images,
                                                         c.stride, c.padding, plan=plan)
        if relu_output is None:  # the v2 epilogue masked it
            oracle.assert_close(c.data.result(g), masked64, c.tolerance(), f"{plan.label()} masked dL/dz")
        gx, ggamma, gbeta = gpu.norm_backward(g, x, c.norm, sums, relu_output, c.images, training=True)
        for name, ours, reference in zip(("dL/dx", "dgamma", "dbeta"), (c.data.result(gx), ggamma, gbeta), expected):
            oracle.assert_close(ours, reference, c.tolerance(), f"{plan.label()} {name}")
        checked.append(plan.version)
    assert ("v2" in checked) == serves(c, "conv_dgrad")


@pytest.mark.parametrize("case", [c for c in CASES if c[0] == "bf16"], ids=[i for c, i in zip(CASES, IDS) if c[0] == "bf16"])
def test_grad_weight_of_the_normalized_input(emulated, case):
    c = Case(*case)
    expected = conv_ref.grad_weight(c.z64, c.gy64, c.w64, c.stride, c.padding)
    plans = c.plans(emulated, "conv_wgrad", Fusion(NORMALIZE, c.norm, None, c.images), (c.x, c.gy))
    assert any(p.version == "v2" for p in plans)
    for plan in plans:
        gw = emulated.conv_grad_weight_fused(c.data.kernel(c.x), c.data.kernel(c.gy), c.w.shape, c.norm, c.images,
                                             c.stride, c.padding, plan=plan)
        assert gw.dtype == numpy.float32
        oracle.assert_close(gw, expected, c.tolerance(), f"{plan.label()} grad-weight")


def test_split_grad_weight_and_the_table_limit(emulated):
    """A normalizing grad-weight may split its reduction (the normalization is per k-tile); its
    table of every group's scale and shift must fit NORM_TABLE_BYTES, else only v1 serves."""
    c = Case("bf16", 4, 7, 5, 64, 72, 3, 1, 1, 2)
    expected = conv_ref.grad_weight(c.z64, c.gy64, c.w64, c.stride, c.padding)
    plan = Plan("v2", "bf16_128x128", 3)
    gw = emulated.conv_grad_weight_fused(c.data.kernel(c.x), c.data.kernel(c.gy), c.w.shape, c.norm, c.images,
                                         c.stride, c.padding, plan=plan)
    oracle.assert_close(gw, expected, c.tolerance(), "split grad-weight")
    tile = conv_v2.TILES["bf16_128x256"]
    many = conv_v2.NORM_TABLE_BYTES // (2 * 2 * tile.bn)  # groups whose table just fits
    geometry = (many * 2, 7, 5, 64, 72, 3, 3, 7, 5, 1, 1)
    assert tile.fits_fusion("conv_wgrad", Fusion(NORMALIZE, None, None, 1), (many, *geometry[1:]))
    assert not tile.fits_fusion("conv_wgrad", Fusion(NORMALIZE, None, None, 1), geometry)


def test_a_fused_epilogue_takes_the_whole_reduction(emulated):
    c = Case(*CASES[0])
    fusion = Fusion(NORMALIZE | STATS, c.norm, None, c.images)
    assert all(p.splits == 1 for p in c.plans(emulated, "conv_fwd", fusion, (c.x, c.w))[1:])
    with pytest.raises(ValueError, match="whole reduction"):
        emulated.conv_forward_fused(c.x, c.w, c.stride, c.padding, norm=c.norm, images=c.images, stats=True,
                                    plan=Plan("v2", "bf16_128x128", 2))


# ---- the batch norms' own steps -----------------------------------------------------------------
def test_affine_updates_the_running_statistics_group_after_group(emulated):
    rng = numpy.random.default_rng(3)
    groups, channels, rows = 3, 40, 98
    stats = numpy.stack([rng.normal(0, 1, (groups, channels)), rng.uniform(0.5, 2, (groups, channels))],
                        axis=1).astype(numpy.float32)
    gamma, beta = rng.uniform(0.5, 1.5, channels).astype(numpy.float32), rng.normal(0, 0.5, channels).astype(numpy.float32)
    running = [rng.normal(0, 0.2, channels).astype(numpy.float32), rng.uniform(0.5, 2, channels).astype(numpy.float32)]
    expected_running = [r.astype(numpy.float64) for r in running]
    for g in range(groups):  # GhostBatchNorm's order: each group in turn
        expected_running[0] = (1 - MOMENTUM) * expected_running[0] + MOMENTUM * stats[g, 0]
        expected_running[1] = (1 - MOMENTUM) * expected_running[1] + MOMENTUM * stats[g, 1] * rows / (rows - 1)
    norm = emulated.batch_norm_affine(stats, gamma, beta, *running, MOMENTUM, EPS, rows)
    inv_std = 1 / numpy.sqrt(stats[:, 1].astype(numpy.float64) + EPS)
    oracle.assert_close(norm[:, NORM["inv_std"]], inv_std, 1e-6, "1/std")
    oracle.assert_close(norm[:, NORM["scale"]], gamma * inv_std, 1e-6, "scale")
    oracle.assert_close(norm[:, NORM["shift"]], beta - stats[:, 0] * gamma * inv_std, 1e-6, "shift")
    numpy.testing.assert_array_equal(norm[:, NORM["mean"]], stats[:, 0])
    for ours, reference in zip(running, expected_running):
        oracle.assert_close(ours, reference, 1e-6, "running statistics")
    evaluation = emulated.batch_norm_affine(stats[:0], gamma, beta, *running, MOMENTUM, EPS, rows)
    assert evaluation.shape == (1, len(NORM_FIELDS), channels)
    oracle.assert_close(evaluation[0, NORM["scale"]], gamma / numpy.sqrt(running[1].astype(numpy.float64) + EPS),
                        1e-6, "evaluation scale")


@pytest.mark.parametrize("projection", [False, True], ids=["identity", "projection"])
def test_norm_add_relu_and_its_backward(emulated, projection):
    c = Case("bf16", 4, 5, 3, 24, 24, 1, 1, 0, 2)
    other = Case("bf16", 4, 5, 3, 24, 24, 1, 1, 0, 2, seed=1)  # the residual and its batch norm
    residual = other.x
    residual_norm = other.norm if projection else None
    r64 = other.normalized(other.x64, relu=False) if projection else other.x64
    pre = c.normalized(c.x64, relu=False) + r64
    out = emulated.norm_add_relu(c.data.kernel(c.x), c.norm, c.images, residual=c.data.kernel(residual),
                                 residual_norm=residual_norm)
    oracle.assert_close(c.data.result(out), numpy.maximum(pre, 0), c.tolerance(), "relu(bn(y) + r)")
    gout = c.data.normal(c.x.shape)
    g64 = c.data.reference(gout) * (c.data.result(out) > 0)  # the kernel's own output decides the mask
    gy, ggamma, gbeta, gresidual = emulated.norm_add_relu_backward(
        c.data.kernel(gout), out, c.data.kernel(c.x), c.norm, c.images, True, residual=c.data.kernel(residual),
        residual_norm=residual_norm)
    for name, ours, reference in zip(("dL/dy", "dgamma", "dbeta"), (c.data.result(gy), ggamma, gbeta),
                                     c.norm_backward(g64)):
        oracle.assert_close(ours, reference, c.tolerance(), name)
    if projection:
        for name, ours, reference in zip(("dL/dr", "residual dgamma", "residual dbeta"),
                                         (c.data.result(gresidual[0]), *gresidual[1:]), other.norm_backward(g64)):
            oracle.assert_close(ours, reference, c.tolerance(), name)
    else:
        oracle.assert_close(c.data.result(gresidual), g64, c.tolerance(), "dL/dr")
