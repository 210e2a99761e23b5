"""Convolutions with the batch norms around them done inside (minidl.ops.normconv's kernel side).

A batch norm between two convolutions takes no pass of its own over the activations: the
convolutions' epilogues give its statistics and sums, the next convolution reads relu(bn(y))
where it reads y, and a block ends in one normalize + add + ReLU. Each fused pass is tuned like
the plain passes: the v1 plan composes the existing kernels and is always a candidate, the v2
plans do the work inside the kernel (kernels/conv_v2_norm.cuh).

Details: docs/kernels.md, "minidl/kernels/normconv.py".
"""
import numpy

from minidl.backend import get_array_module
from minidl.kernels import conv_v2
from minidl.kernels.autotune import comparable
from minidl.kernels.batchnorm import NORM
from minidl.kernels.conv import LATER_VERSIONS, conv_geometry
from minidl.kernels.conv_v2 import DRELU, NORMALIZE, STATS, Fusion
from minidl.kernels.launch import Launcher


def group_slices(n, images):
    """The image ranges of the statistics groups of a batch of n."""
    return [slice(first, first + images) for first in range(0, n, images)]


def fusion_inputs(operands, fusion):
    """A fused pass's arrays that its plans depend on: the operands, and the batch norm's input y
    that grad-input reads too."""
    return (*operands, *((fusion.bn_input,) if fusion.bn_input is not None else ()))


def rows_per_image(x):
    return x.shape[1] * x.shape[2]


class NormConvKernels(Launcher):
    """Needs the convolution and batch-norm launchers beside it (minidl.kernels.Kernels)."""

    def conv_forward_fused(self, x, w, stride, padding, norm=None, images=None, stats=False, plan=None):
        """(conv(x̂, w), its (groups, 2, K) statistics or None): x̂ = relu(x·scale + shift) with
        `norm` of x's groups, else x; `images` per statistics group (None: the batch)."""
        geometry = conv_geometry(x.shape, w.shape, stride, padding)
        n, _, _, _, k, _, _, p, q = geometry[:9]
        images = images or n
        y = get_array_module(x).empty((n, p, q, k), dtype=x.dtype)
        fusion = Fusion((NORMALIZE if norm is not None else 0) | (STATS if stats else 0), norm, None, images)
        sums, _ = self._fused("conv_fwd", geometry, self.aligned(x, w), y, fusion, plan)
        return y, (self.batch_norm_moments(sums, images * p * q) if stats else None)

    def conv_grad_input_fused(self, gy, w, y, norm, images, stride, padding, plan=None):
        """(g, sums, relu_output) for a convolution of relu(y·scale + shift): g = dL/dz masked by
        y·scale + shift > 0 (or, from the v1 plan, dL/dz unmasked with `relu_output` the mask),
        `sums` each group's slabs of Σg, Σg·(y − mean): what norm_backward takes."""
        geometry = conv_geometry(y.shape, w.shape, stride, padding)
        g = get_array_module(gy).empty(y.shape, dtype=gy.dtype)
        gy, w, y = self.aligned(gy, w, y)
        sums, relu_output = self._fused("conv_dgrad", geometry, (gy, w), g, Fusion(DRELU, norm, y, images), plan)
        return g, sums, relu_output

    def conv_grad_weight_fused(self, x, gy, w_shape, norm, images, stride, padding, plan=None, normalized=None):
        """dL/dw (float32) of a convolution of relu(x·scale + shift); `normalized`: that input if
        it is already written (grad-input's v1 plan gives it), which a v1 plan then reads."""
        geometry = conv_geometry(x.shape, w_shape, stride, padding)
        gw = get_array_module(x).empty(w_shape, dtype=numpy.float32)
        self._fused("conv_wgrad", geometry, self.aligned(x, gy), gw, Fusion(NORMALIZE, norm, None, images), plan,
                    normalized)
        return gw

    def norm_backward(self, g, y, norm, sums, relu_output, images, training, residual_out=None):
        """(dL/dy, dγ, dβ) of the batch norm whose normalized, rectified output a convolution read:
        g and sums from conv_grad_input_fused (or norm_add_relu_backward's); g masked by
        `relu_output` > 0 where that is given, and so into `residual_out` when that is given."""
        ggamma, gbeta, k1, k0 = self.batch_norm_backward_coefficients(sums, images * rows_per_image(y), norm,
                                                                      training)
        gy = get_array_module(g).empty_like(y)
        for index, part in enumerate(group_slices(len(y), images)):
            mask = None if relu_output is None else relu_output[part]
            self.batch_norm_backward_apply(g[part], y[part], mask, norm[index, NORM["mean"]],
                                           norm[index, NORM["scale"]], k1[index], k0[index], out=gy[part],
                                           residual_out=None if residual_out is None else residual_out[part])
        return gy, ggamma, gbeta

    def norm_add_relu(self, y, norm, images, residual=None, residual_norm=None):
        """relu(bn(y) + r), r = 0, `residual`, or bn'(residual) with `residual_norm`."""
        out = get_array_module(y).empty_like(y)
        for index, part in enumerate(group_slices(len(y), images)):
            residual_affine = (None, None) if residual_norm is None else (
                residual_norm[index, NORM["scale"]], residual_norm[index, NORM["shift"]])
            self.batch_norm_apply(y[part], norm[index, NORM["scale"]], norm[index, NORM["shift"]], True,
                                  None if residual is None else residual[part], *residual_affine, out=out[part])
        return out

    def norm_add_relu_backward(self, gout, out, y, norm, images, training, residual=None, residual_norm=None):
        """(dL/dy, dγ, dβ, and for the residual: its gradient (identity), or (dL/dr, dγ', dβ')
        with `residual_norm`, or None)."""
        gresidual = get_array_module(gout).empty_like(gout) if residual is not None and residual_norm is None else None
        gy, ggamma, gbeta = self._through_relu(gout, out, y, norm, images, training, gresidual)
        if residual_norm is not None:
            return gy, ggamma, gbeta, self._through_relu(gout, out, residual, residual_norm, images, training)
        return gy, ggamma, gbeta, gresidual

    def _through_relu(self, gout, out, y, norm, images, training, residual_out=None):
        sums = self._backward_sums(gout, y, out, norm, images)
        return self.norm_backward(gout, y, norm, sums, out, images, training, residual_out)

    # ---- plans: the v1 composition, or a v2 kernel doing it all ---------------------------------
    def _fused(self, conv_pass, geometry, operands, out, fusion, plan, normalized=None):
        """(sums or None, relu_output or None) of one fused pass, the plan tuned per shape."""
        if plan is None:
            plan = self.tuned_plan(conv_pass, fusion_inputs(operands, fusion), geometry,
                                   lambda: self.fused_plans(conv_pass, fusion, operands, geometry),
                                   lambda candidate: self._fused(conv_pass, geometry, operands, out, fusion,
                                                                 candidate, normalized),
                                   fusion, lambda result: self._outputs(conv_pass, geometry, out, fusion, result))
        if plan.version == "v2":
            tile = conv_v2.TILES[plan.tile]
            return conv_v2.launch(self, conv_pass, tile, plan.splits, geometry, *operands, out, fusion), None
        return self._composed(conv_pass, geometry, operands, out, fusion, plan, normalized)

    def _outputs(self, conv_pass, geometry, out, fusion, result):
        """What two plans of a fused pass must agree on: the output (grad-input's masked as the v2
        kernels mask it), and the statistics or the batch norm's dγ, dβ finalized from the sums
        (the plans' slabs differ in number)."""
        sums, relu_output = result
        images = fusion.group_images
        if conv_pass == "conv_fwd":
            p, q = geometry[7:9]
            return (out,) + ((self.batch_norm_moments(sums, images * p * q),) if fusion.bits & STATS else ())
        if conv_pass == "conv_wgrad":
            return (out,)
        g = comparable(out) if relu_output is None else comparable(out) * (comparable(relu_output) > 0)
        ggamma, gbeta, _, _ = self.batch_norm_backward_coefficients(sums, images * rows_per_image(out), fusion.norm,
                                                                    True)
        return g, ggamma, gbeta

    def fused_plans(self, conv_pass, fusion, operands, geometry):
        """The plain pass's plans (v1 first), with y among the operands that v2 needs aligned, of
        the families with a kernel for this fusion (v3: the plain pass only); an epilogue that
        reduces over the block's rows takes the whole reduction (no split-K), and a normalizing
        pass's table must fit."""
        plans = self.plans(conv_pass, fusion_inputs(operands, fusion), geometry)
        return [plans[0]] + [p for p in plans[1:] if (p.splits == 1 or not fusion.whole_reduction)
                             and LATER_VERSIONS[p.version].TILES[p.tile].fits_fusion(conv_pass, fusion, geometry)]

    def _composed(self, conv_pass, geometry, operands, out, fusion, plan, normalized=None):
        a, b = operands
        images = fusion.group_images
        if conv_pass == "conv_fwd":
            x = self._normalized(a, fusion.norm, images) if fusion.bits & NORMALIZE else a
            self._run(conv_pass, geometry, (x, b), out, plan)
            return (self._moments_sums(out, images) if fusion.bits & STATS else None), None
        if conv_pass == "conv_wgrad":
            x = normalized if normalized is not None else self._normalized(a, fusion.norm, images)
            self._run(conv_pass, geometry, (x, b), out, plan)
            return None, None
        self._run(conv_pass, geometry, operands, out, plan)
        relu_output = self._normalized(fusion.bn_input, fusion.norm, images)
        return self._backward_sums(out, fusion.bn_input, relu_output, fusion.norm, images), relu_output

    def _normalized(self, x, norm, images):
        """relu(x·scale + shift) per group, written out (the v1 composition)."""
        z = get_array_module(x).empty_like(x)
        for index, part in enumerate(group_slices(len(x), images)):
            self.batch_norm_apply(x[part], norm[index, NORM["scale"]], norm[index, NORM["shift"]], True, out=z[part])
        return z

    def _moments_sums(self, y, images):
        """bn_stats' slabs per group, (groups, slabs, 3, C)."""
        parts = group_slices(len(y), images)
        slabs = self.batch_norm_slabs(images * rows_per_image(y), y.shape[-1])
        sums = get_array_module(y).empty((len(parts), slabs, 3, y.shape[-1]), dtype=numpy.float32)
        for index, part in enumerate(parts):
            self.batch_norm_partials(y[part], out=sums[index])
        return sums

    def _backward_sums(self, g, y, mask, norm, images):
        """bn_backward_reduce's slabs per group, (groups, slabs, 2, C): Σ g, Σ g·(y − mean), g
        masked by `mask` > 0."""
        parts = group_slices(len(y), images)
        slabs = self.batch_norm_slabs(images * rows_per_image(y), y.shape[-1])
        sums = get_array_module(y).empty((len(parts), slabs, 2, y.shape[-1]), dtype=numpy.float32)
        for index, part in enumerate(parts):
            self.batch_norm_backward_partials(g[part], y[part], mask[part], norm[index, NORM["mean"]],
                                              out=sums[index])
        return sums
