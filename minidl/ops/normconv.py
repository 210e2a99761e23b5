"""Convolutions fused with the batch norms around them, after NVIDIA's MLPerf ResNet-50
("normconv" blocks): no pass of its own touches the activations for batch norm.

A residual chain is three ops: `conv2d_stats` (a convolution and its output's per-group
statistics), `bn_relu_conv2d_stats` (the convolution of relu(bn(y)), which is never written)
and `bn_add_relu` (relu(bn(y) + r)). `bn` is a `BN`: γ, β, the running statistics, the mode.
The CPU path (minidl.ops.norm_groups on the hooks of minidl.ops.conv) is the reference for
minidl.kernels.normconv. Saved for backward: y (never relu(bn(y))) and the statistics.

Details: docs/ops.md, "minidl/ops/normconv.py".
"""
from typing import NamedTuple

import numpy

from minidl import workspace
from minidl.backend import get_array_module
from minidl.ops.conv import Conv2d, correlate, grads, image_rows
from minidl.ops.dispatch import Op
from minidl.ops.norm import group_images
from minidl.ops.norm_groups import GroupNorm, Moments
from minidl.parallel import run_chunks


class BN(NamedTuple):
    """A batch norm as the fused ops take it: γ and β (Tensors), the running statistics (arrays,
    or None: not tracked), the mode, momentum, ε, and the ghost-group size (None: the batch)."""
    gamma: object
    beta: object
    running_mean: object = None
    running_var: object = None
    training: bool = True
    momentum: float = 0.1
    eps: float = 1e-5
    group_size: int = None

    @property
    def norm_args(self):
        return self.running_mean, self.running_var, self.training, self.momentum, self.eps

    def over(self, stats, shape, gamma, beta):
        """Its GroupNorm for an NHWC tensor of `shape` (γ, β: the arrays of the op's inputs)."""
        return GroupNorm(stats, gamma, beta, *self.norm_args, self.group_size, shape)

    def group_images(self, n):
        return group_images(n, self.training, self.group_size)

    def kernel_norm(self, kernels, stats, shape, gamma, beta):
        """The kernels' norm array (minidl.kernels.batchnorm) for an NHWC input of `shape` with
        these statistics (training; the running statistics updated) or none (evaluation)."""
        n, h, w, _ = shape
        return kernels.batch_norm_affine(stats, gamma, beta, self.running_mean, self.running_var, self.momentum,
                                         self.eps, self.group_images(n) * h * w)


def no_stats(like, channels):
    """The statistics of an output no batch norm in training follows: none."""
    return get_array_module(like).empty((0, 2, channels), dtype=numpy.float32)


class Conv2dStats(Conv2d):
    """(x, w) -> (y, stats)."""

    def __init__(self, stride, padding, training, group_size, weight_bf16=None):
        super().__init__(stride, padding, weight_bf16)
        self.stats_of = training, group_size

    def convolve(self, x, w, load=None):
        self.x, self.w, self.has_bias = x, w, False
        moments = Moments(len(x), *self.stats_of)
        y = correlate(x, w, self.stride, self.padding, load, moments)
        return y, moments.statistics(y)

    def forward_reference(self, x, w):
        return self.convolve(x, w)

    def backward_reference(self, gy, _=None):
        return super().backward_reference(gy)

    def forward_kernels(self, kernels, x, w, norm=None):
        """The convolution (of relu(x·scale + shift) with `norm`) and, in training, its output's
        statistics, taken inside the kernel where a plan allows. The input's batch norm and the
        output's statistics share the groups: `self.images` images each."""
        self.keep_for_kernels(kernels, x, w)
        training, group_size = self.stats_of
        self.images = group_images(len(x), training, group_size)
        if not training:
            y = (kernels.conv_forward(x, self.w, self.stride, self.padding) if norm is None else
                 kernels.conv_forward_fused(x, self.w, self.stride, self.padding, norm, self.images)[0])
            return y, no_stats(x, w.shape[0])
        return kernels.conv_forward_fused(x, self.w, self.stride, self.padding, norm, self.images, stats=True)

    def backward_kernels(self, kernels, gy, _=None):
        return super().backward_kernels(kernels, gy)


class BNReLUConv2dStats(Conv2dStats):
    """(y, stats, γ, β, w) -> (conv(relu(bn(y)), w), its stats)."""

    def __init__(self, bn, stride, padding, weight_bf16=None):
        super().__init__(stride, padding, bn.training, bn.group_size, weight_bf16)
        self.bn = bn._replace(gamma=None, beta=None)  # the parameters' arrays come as inputs

    def state_arrays(self):
        return self.bn.running_mean, self.bn.running_var

    def input_grad_wanted(self):  # dL/dz: batch norm's backward needs it for dγ and dβ
        return True

    def forward_reference(self, y, stats, gamma, beta, w):
        self.norm = self.bn.over(stats, y.shape, gamma, beta)
        return self.convolve(y, w, self.norm.load)

    def backward_reference(self, gy, _=None):
        y = self.x
        gz, gw = grads(gy, y, self.w, self.stride, self.padding, load=self.norm.load, store=self._record_sums)
        ggamma, gbeta = self.norm.input_gradient(gz, y, out=gz)
        return gz, None, ggamma, gbeta, gw

    def _record_sums(self, g, first, relu_input=True):
        self.norm.record_sums(g, self.x[first:first + len(g)], first, relu_input)

    def forward_kernels(self, kernels, y, stats, gamma, beta, w):
        self.norm = self.bn.kernel_norm(kernels, stats, y.shape, gamma, beta)
        return super().forward_kernels(kernels, y, w, self.norm)

    def backward_kernels(self, kernels, gy, _=None):
        y, norm, images = self.x, self.norm, self.images
        g, sums, relu_output = kernels.conv_grad_input_fused(gy, self.w, y, norm, images, self.stride, self.padding)
        gw = kernels.conv_grad_weight_fused(y, gy, self.w_shape, norm, images, self.stride, self.padding,
                                            normalized=relu_output)
        gy_in, ggamma, gbeta = kernels.norm_backward(g, y, norm, sums, relu_output, images, self.bn.training)
        return gy_in, None, ggamma, gbeta, gw


class BNAddReLU(Op):
    """(y, stats, γ, β[, residual][, residual_stats, residual γ, residual β]) -> relu(bn(y) + r)."""

    def __init__(self, bn, residual=False, residual_bn=None):
        self.bn = bn._replace(gamma=None, beta=None)
        self.residual_bn = None if residual_bn is None else residual_bn._replace(gamma=None, beta=None)
        self.has_residual = residual

    def state_arrays(self):
        arrays = [self.bn.running_mean, self.bn.running_var]
        if self.residual_bn is not None:
            arrays += [self.residual_bn.running_mean, self.residual_bn.running_var]
        return arrays

    def forward_reference(self, y, stats, gamma, beta, residual=None, residual_stats=None, *residual_gamma_beta):
        xp = get_array_module(y)
        self.norm = self.bn.over(stats, y.shape, gamma, beta)
        self.residual_norm = None
        if self.residual_bn is not None:
            self.residual_norm = self.residual_bn.over(residual_stats, residual.shape, *residual_gamma_beta)
        out = xp.empty_like(y)

        def chunk(first, stop):
            rows = image_rows(out[first:stop])
            self.norm.affine(image_rows(y[first:stop]), rows, first)
            if self.residual_norm is not None:
                normalized = workspace.scratch("residual", rows.shape, rows)
                self.residual_norm.affine(image_rows(residual[first:stop]), normalized, first)
                rows += normalized
            elif residual is not None:
                rows += image_rows(residual[first:stop])
            xp.maximum(rows, self.norm.zero_row, out=rows)

        run_chunks(chunk, len(y), 3 * y[0].nbytes)
        self.y, self.residual, self.out = y, residual, out
        return out

    def backward_reference(self, gout):
        xp = get_array_module(gout)
        y, residual, out = self.y, self.residual, self.out
        g = xp.empty_like(gout)  # dL/d(bn(y) + r): also the residual's gradient

        def chunk(first, stop):
            block = g[first:stop]
            xp.multiply(gout[first:stop], out[first:stop] > 0, out=block)
            self.norm.record_sums(block, y[first:stop], first)
            if self.residual_norm is not None:
                self.residual_norm.record_sums(block, residual[first:stop], first)

        run_chunks(chunk, len(y), 3 * y[0].nbytes)
        gy = xp.empty_like(g) if self.has_residual else g  # without a shortcut g is not needed after
        grads = (gy, None, *self.norm.input_gradient(g, y, gy))
        if self.residual_norm is not None:  # the projection's gradient: g's last use, written over it
            return (*grads, g, None, *self.residual_norm.input_gradient(g, residual, g))
        return (*grads, g) if self.has_residual else grads

    def forward_kernels(self, kernels, y, stats, gamma, beta, residual=None, residual_stats=None,
                        *residual_gamma_beta):
        self.images = self.bn.group_images(len(y))
        self.norm = self.bn.kernel_norm(kernels, stats, y.shape, gamma, beta)
        self.residual_norm = None
        if self.residual_bn is not None:
            if self.residual_bn.group_images(len(y)) != self.images:
                raise ValueError("bn_add_relu: the two batch norms must take their statistics over the same groups")
            self.residual_norm = self.residual_bn.kernel_norm(kernels, residual_stats, residual.shape,
                                                              *residual_gamma_beta)
        self.y, self.residual = y, residual
        self.out = kernels.norm_add_relu(y, self.norm, self.images, residual, self.residual_norm)
        return self.out

    def backward_kernels(self, kernels, gout):
        gy, ggamma, gbeta, gresidual = kernels.norm_add_relu_backward(
            gout, self.out, self.y, self.norm, self.images, self.bn.training, self.residual, self.residual_norm)
        grads = gy, None, ggamma, gbeta
        if self.residual_bn is not None:
            gresidual, gr_gamma, gr_beta = gresidual
            return (*grads, gresidual, None, gr_gamma, gr_beta)
        return (*grads, gresidual) if self.has_residual else grads


def conv2d_stats(x, w, stride=1, padding=0, training=True, group_size=None):
    """(conv2d(x, w), the statistics of its output for a batch norm of this mode and group size)."""
    return Conv2dStats(stride, padding, training, group_size, getattr(w, "bf16", None))(x, w)


def bn_relu_conv2d_stats(y, stats, bn, w, stride=1, padding=0):
    """(conv2d(relu(bn(y)), w), its statistics) without writing relu(bn(y)); `stats` are y's."""
    return BNReLUConv2dStats(bn, stride, padding, getattr(w, "bf16", None))(y, stats, bn.gamma, bn.beta, w)


def bn_add_relu(y, stats, bn, residual=None, residual_stats=None, residual_bn=None):
    """relu(bn(y) + r): r = 0, `residual`, or residual_bn(residual) with `residual_stats`."""
    inputs = [y, stats, bn.gamma, bn.beta] + ([] if residual is None else [residual])
    if residual_bn is not None:
        inputs += [residual_stats, residual_bn.gamma, residual_bn.beta]
    return BNAddReLU(bn, residual is not None, residual_bn)(*inputs)
