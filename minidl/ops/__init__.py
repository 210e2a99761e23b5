"""Differentiable operations on NHWC tensors (reference implementations in xp code).

These run on NumPy and CuPy alike and are the oracle for the CUDA kernels.
"""
from minidl.autograd import add
from minidl.ops.activation import relu
from minidl.ops.cast import to_compute_dtype, to_float
from minidl.ops.conv import conv2d
from minidl.ops.norm_relu import batch_norm_add_relu, batch_norm_relu
from minidl.ops.linear import linear
from minidl.ops.loss import softmax_cross_entropy
from minidl.ops.norm import batch_norm
from minidl.ops.normconv import BN, bn_add_relu, bn_relu_conv2d_stats, conv2d_stats
from minidl.ops.pool import global_avg_pool, max_pool2d

__all__ = ["BN", "add", "batch_norm", "batch_norm_add_relu", "batch_norm_relu", "bn_add_relu", "bn_relu_conv2d_stats",
           "conv2d", "conv2d_stats", "global_avg_pool", "linear", "max_pool2d", "relu", "softmax_cross_entropy",
           "to_compute_dtype", "to_float"]
