"""Checks of the convolutions fused with batch norm (kernels/conv_v2_norm.cuh through
minidl/kernels/normconv.py), every plan of each fused pass (the v1 composition and each v2 tile
that fits) against float64 references written here from the definitions:

    forward      y = conv(relu(x·scale_g + shift_g), w), and per statistics group g the mean and
                 biased variance of y (of y as stored: the statistics the next batch norm uses)
    grad-input   through relu(bn(x)): the batch norm's dL/dx, dγ, dβ from the convolution's dL/dz
    grad-weight  conv's dL/dw with relu(x·scale_g + shift_g) as its input
    block end    relu(bn(y) + r), r the residual or bn'(residual), and its backward

scale, shift and the batch statistics are the kernel's inputs and the reference's alike (float32
values); bf16 kernels round scale and shift to bf16 for fma.rn.relu.bf16x2, which the bf16
tolerance covers. Shared by the CPU-emulation tests (odd shapes, NumPy) and the GPU cases
(ResNet-50 shapes, CuPy): each check returns the plans it checked.
"""
import numpy

import oracle
from minidl.backend import to_numpy
from minidl.kernels import conv_v2
from minidl.kernels.batchnorm import NORM, NORM_FIELDS
from minidl.kernels.conv_v2 import DRELU, NORMALIZE, STATS, Fusion
from minidl.kernels.normconv import group_slices
from minidl.ops import conv as conv_ref

EPS, MOMENTUM = 1e-5, 0.1
STATS_TOLERANCE = 1e-5  # fp32 moments of the stored output against float64 ones of the same values


class Case:
    """Random data of one fused convolution: x (the batch norm's input), its per-group batch
    statistics and the norm array built from them, w, the gradient reaching the output; on xp."""

    def __init__(self, xp, mode, n, h, w, c, k, r, stride, padding, images, seed=0):
        self.xp, self.mode, self.stride, self.padding, self.images = xp, mode, stride, padding, images
        self.data = data = oracle.Inputs(xp, mode, seed)
        self.x = data.normal((n, h, w, c), offset=0.3)
        self.w = data.normal((k, r, r, c), scale=(r * r * c) ** -0.5)
        gamma = data.rng.uniform(0.5, 1.5, c).astype(numpy.float32)
        beta = data.rng.uniform(-0.5, 0.5, c).astype(numpy.float32)
        self.x64, self.w64 = data.reference(self.x), data.reference(self.w)
        self.groups = group_slices(n, images)
        norm = numpy.zeros((len(self.groups), len(NORM_FIELDS), c), numpy.float32)
        host = to_numpy(self.x64)
        for g, part in enumerate(self.groups):
            rows = host[part].reshape(-1, c)
            mean, var = rows.mean(axis=0), rows.var(axis=0)
            inv_std = 1.0 / numpy.sqrt(var + EPS)
            norm[g, NORM["mean"]], norm[g, NORM["inv_std"]] = mean, inv_std
            norm[g, NORM["scale"]] = gamma * inv_std
            norm[g, NORM["shift"]] = beta - mean * norm[g, NORM["scale"]]
        self.norm = xp.asarray(norm)
        self.norm64 = xp.asarray(norm.astype(numpy.float64))
        self.z64 = self.normalized(self.x64)
        self.y64 = conv_ref.correlate(self.z64, self.w64, stride, padding)
        self.gy = data.normal(self.y64.shape)
        self.gy64 = data.reference(self.gy)
        self.geometry = (n, h, w, c, k, r, r, *self.y64.shape[1:3], stride, padding)
        self.tolerance = oracle.TOLERANCE[mode]

    def normalized(self, x64, relu=True):
        out = self.xp.empty_like(x64)
        for g, part in enumerate(self.groups):
            out[part] = x64[part] * self.norm64[g, NORM["scale"]] + self.norm64[g, NORM["shift"]]
        return self.xp.maximum(out, 0.0) if relu else out

    def norm_backward(self, g64):
        """(dL/dx, dγ, dβ) of batch norm from dL/d(bn(x)), per group, dγ and dβ summed."""
        gx, ggamma, gbeta = self.xp.empty_like(g64), 0.0, 0.0
        for g, part in enumerate(self.groups):
            gg = g64[part].reshape(-1, g64.shape[-1])
            mean, inv_std, scale = (self.norm64[g, NORM[f]] for f in ("mean", "inv_std", "scale"))
            xhat = (self.x64[part].reshape(gg.shape) - mean) * inv_std
            ggamma, gbeta = ggamma + (gg * xhat).sum(axis=0), gbeta + gg.sum(axis=0)
            gx[part] = (scale * (gg - gg.mean(axis=0) - xhat * (gg * xhat).mean(axis=0))).reshape(g64[part].shape)
        return gx, ggamma, gbeta

    def plans(self, kernels, conv_pass, fusion, operands):
        plans = kernels.fused_plans(conv_pass, fusion, [self.data.kernel(a) for a in operands], self.geometry)
        assert plans[0].version == "v1", "the composition of the existing kernels is always a candidate"
        return plans

    def serves(self, conv_pass):
        """Whether some v2 tile computes this pass of the case (its reduction a multiple of BK)."""
        return any(tile.fits(conv_pass, self.x.dtype, self.geometry) for tile in conv_v2.TILES.values())


def with_tf32(check):
    """The check with TF32 allowed (float32 data on the TF32 tiles), as a fused chain runs."""
    def run(kernels, xp, *args, **kwargs):
        previous, kernels.allow_tf32 = kernels.allow_tf32, True
        try:
            return check(kernels, xp, *args, **kwargs)
        finally:
            kernels.allow_tf32 = previous
    run.__name__ = check.__name__
    return run


@with_tf32
def check_forward(kernels, xp, *case, normalize=True, stats=True):
    """Forward with the input's batch norm (normalize) and/or the output's statistics (stats)."""
    c = Case(xp, *case)
    norm = c.norm if normalize else None
    expected = c.y64 if normalize else conv_ref.correlate(c.x64, c.w64, c.stride, c.padding)
    fusion = Fusion((NORMALIZE if normalize else 0) | (STATS if stats else 0), norm, None, c.images)
    checked = []
    for plan in c.plans(kernels, "conv_fwd", fusion, (c.x, c.w)):
        y, found = kernels.conv_forward_fused(c.data.kernel(c.x), c.data.kernel(c.w), c.stride, c.padding, norm=norm,
                                              images=c.images, stats=stats, plan=plan)
        what = f"{plan.label()} forward"
        oracle.assert_close(c.data.result(y), expected, c.tolerance, what)
        if stats:
            stored = to_numpy(c.data.result(y)).astype(numpy.float64)
            assert found.shape == (len(c.groups), 2, y.shape[-1])
            for g, part in enumerate(c.groups):
                rows = stored[part].reshape(-1, y.shape[-1])
                oracle.assert_close(found[g, 0], rows.mean(axis=0), STATS_TOLERANCE, f"{what}: group {g} mean")
                oracle.assert_close(found[g, 1], rows.var(axis=0), STATS_TOLERANCE, f"{what}: group {g} variance")
        else:
            assert found is None
        checked.append(plan.label())
    assert any(p.startswith("v2") for p in checked) == c.serves("conv_fwd")
    return {"plans": checked}


@with_tf32
def check_grad_input(kernels, xp, *case):
    c = Case(xp, *case)
    gz64 = conv_ref.grad_input(c.gy64, c.w64, c.x.shape, c.stride, c.padding)
    masked64 = gz64 * (c.normalized(c.x64, relu=False) > 0)
    expected = c.norm_backward(masked64)
    checked = []
    for plan in c.plans(kernels, "conv_dgrad", Fusion(DRELU, c.norm, c.data.kernel(c.x), c.images), (c.gy, c.w)):
        x = c.data.kernel(c.x)
        g, sums, relu_output = kernels.conv_grad_input_fused(c.data.kernel(c.gy), c.data.kernel(c.w), x, c.norm,
                                                             c.images, c.stride, c.padding, plan=plan)
        if relu_output is None:  # the v2 epilogue masked it
            oracle.assert_close(c.data.result(g), masked64, c.tolerance, f"{plan.label()} masked dL/dz")
        gx, ggamma, gbeta = kernels.norm_backward(g, x, c.norm, sums, relu_output, c.images, training=True)
        for name, ours, reference in zip(("dL/dx", "dgamma", "dbeta"), (c.data.result(gx), ggamma, gbeta), expected):
            oracle.assert_close(ours, reference, c.tolerance, f"{plan.label()} {name}")
        checked.append(plan.label())
    assert any(p.startswith("v2") for p in checked) == c.serves("conv_dgrad")
    return {"plans": checked}


def check_grad_weight(kernels, xp, *case, plans=None):
    """Grad-weight of the normalized input, every plan (or the given ones)."""
    c = Case(xp, *case)
    expected = conv_ref.grad_weight(c.z64, c.gy64, c.w64, c.stride, c.padding)
    plans = plans or c.plans(kernels, "conv_wgrad", Fusion(NORMALIZE, c.norm, None, c.images), (c.x, c.gy))
    for plan in plans:
        gw = kernels.conv_grad_weight_fused(c.data.kernel(c.x), c.data.kernel(c.gy), c.w.shape, c.norm, c.images,
                                            c.stride, c.padding, plan=plan)
        assert gw.dtype == numpy.float32
        oracle.assert_close(gw, expected, c.tolerance, f"{plan.label()} grad-weight")
    return {"plans": [p.label() for p in plans]}


def check_add_relu(kernels, xp, mode, n, h, w, c, images, projection):
    """relu(bn(y) + r) and its backward; r the residual, or bn'(residual) (a projection)."""
    main = Case(xp, mode, n, h, w, c, c, 1, 1, 0, images)
    other = Case(xp, mode, n, h, w, c, c, 1, 1, 0, images, seed=1)  # the residual and its batch norm
    residual_norm = other.norm if projection else None
    r64 = other.normalized(other.x64, relu=False) if projection else other.x64
    out = kernels.norm_add_relu(main.data.kernel(main.x), main.norm, images, residual=main.data.kernel(other.x),
                                residual_norm=residual_norm)
    expected = xp.maximum(main.normalized(main.x64, relu=False) + r64, 0)
    oracle.assert_close(main.data.result(out), expected, main.tolerance, "relu(bn(y) + r)")
    gout = main.data.normal(main.x.shape)
    g64 = main.data.reference(gout) * (xp.asarray(main.data.result(out)) > 0)  # the kernel's output decides the mask
    gy, ggamma, gbeta, gresidual = kernels.norm_add_relu_backward(
        main.data.kernel(gout), out, main.data.kernel(main.x), main.norm, images, True,
        residual=main.data.kernel(other.x), residual_norm=residual_norm)
    for name, ours, reference in zip(("dL/dy", "dgamma", "dbeta"), (main.data.result(gy), ggamma, gbeta),
                                     main.norm_backward(g64)):
        oracle.assert_close(ours, reference, main.tolerance, name)
    if projection:
        for name, ours, reference in zip(("dL/dr", "residual dgamma", "residual dbeta"),
                                         (main.data.result(gresidual[0]), *gresidual[1:]), other.norm_backward(g64)):
            oracle.assert_close(ours, reference, main.tolerance, name)
    else:
        oracle.assert_close(main.data.result(gresidual), g64, main.tolerance, "dL/dr")
    return {}
