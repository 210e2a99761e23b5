"""The ResNet family (He et al. 2016), NHWC, with torchvision's module names.

ImageNet models `resnet18` ... `resnet152` (v1.5: a bottleneck downsamples in its 3×3 conv)
and CIFAR models `resnet20/32/56` and `resnet8_w8` (depth 6n+2, 3×3 stem); a shortcut that
changes shape is a 1×1 convolution + BN. Initialization follows Goyal et al. Every BN that a
ReLU follows is fused with it; with `fuse` the batch norms are fused into the convolutions
instead, and `compute_dtype` set to bf16 runs the residual stages in bf16.

Details: docs/design.md, "minidl/models/resnet.py".
"""
import math

from minidl import nn, ops


def conv3x3(in_channels, out_channels, stride=1):
    return nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)


def conv1x1(in_channels, out_channels, stride=1):
    return nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)


def bn_relu(bn, x, residual=None):
    """relu(bn(x) [+ residual]) as one fused op, with the BatchNorm2d module's parameters and state."""
    state = bn.running_mean, bn.running_var, bn.training, bn.momentum, bn.eps, bn.group_size
    if residual is None:
        return ops.batch_norm_relu(x, bn.weight, bn.bias, *state)
    return ops.batch_norm_add_relu(x, residual, bn.weight, bn.bias, *state)


def bn_of(bn):
    """A BatchNorm2d module as the fused ops take it (its parameters, state and mode)."""
    return ops.BN(bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.training, bn.momentum, bn.eps,
                  bn.group_size)


def conv_stats(conv, x, bn):
    """conv(x) and its output's statistics for `bn`."""
    return ops.conv2d_stats(x, conv.weight, conv.stride, conv.padding, bn.training, bn.group_size)


def bn_relu_conv_stats(bn, y, stats, conv):
    """conv(relu(bn(y))) and its output's statistics, relu(bn(y)) never written."""
    return ops.bn_relu_conv2d_stats(y, stats, bn_of(bn), conv.weight, conv.stride, conv.padding)


def block_end(bn, y, stats, x, downsample):
    """relu(bn(y) + shortcut(x)), the shortcut's BN (a projection's) in the same pass."""
    if downsample is None:
        return ops.bn_add_relu(y, stats, bn_of(bn), x)
    conv, residual_bn = downsample
    residual, residual_stats = conv_stats(conv, x, residual_bn)
    return ops.bn_add_relu(y, stats, bn_of(bn), residual, residual_stats, bn_of(residual_bn))


def shortcut(in_channels, out_channels, stride):
    """The projection shortcut where the block changes shape; None (identity) otherwise."""
    if stride == 1 and in_channels == out_channels:
        return None
    return nn.Sequential(conv1x1(in_channels, out_channels, stride), nn.BatchNorm2d(out_channels))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_channels, planes, stride=1, fuse=False):
        super().__init__()
        self.fuse = fuse
        self.conv1 = conv3x3(in_channels, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = shortcut(in_channels, planes, stride)

    @property
    def last_bn(self):
        return self.bn2

    def forward(self, x):
        if self.fuse:
            y, stats = bn_relu_conv_stats(self.bn1, *conv_stats(self.conv1, x, self.bn1), self.conv2)
            return block_end(self.bn2, y, stats, x, self.downsample)
        out = bn_relu(self.bn1, self.conv1(x))
        identity = x if self.downsample is None else self.downsample(x)
        return bn_relu(self.bn2, self.conv2(out), residual=identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels, planes, stride=1, fuse=False):
        super().__init__()
        self.fuse = fuse
        self.conv1 = conv1x1(in_channels, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.downsample = shortcut(in_channels, planes * self.expansion, stride)

    @property
    def last_bn(self):
        return self.bn3

    def forward(self, x):
        if self.fuse:
            y, stats = bn_relu_conv_stats(self.bn1, *conv_stats(self.conv1, x, self.bn1), self.conv2)
            y, stats = bn_relu_conv_stats(self.bn2, y, stats, self.conv3)
            return block_end(self.bn3, y, stats, x, self.downsample)
        out = bn_relu(self.bn1, self.conv1(x))
        out = bn_relu(self.bn2, self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return bn_relu(self.bn3, self.conv3(out), residual=identity)


class ResNet(nn.Module):
    """Stem (conv1, bn1 + ReLU, optional max pool), stages of residual blocks, global average
    pool, classifier. `fuse`: the batch norms fused into the convolutions (minidl.ops.normconv)."""

    def __init__(self, stem, block, stage_planes, stage_blocks, num_classes, zero_init_residual, fuse=False):
        super().__init__()
        self.fuse = fuse
        self.conv1, self.bn1, self.maxpool = stem
        in_channels = stage_planes[0]
        for index, (planes, blocks) in enumerate(zip(stage_planes, stage_blocks)):
            stride = 1 if index == 0 else 2
            stage = []
            for b in range(blocks):
                stage.append(block(in_channels, planes, stride if b == 0 else 1, fuse))
                in_channels = planes * block.expansion
            setattr(self, f"layer{index + 1}", nn.Sequential(*stage))
        self.num_stages = len(stage_planes)
        self.avgpool = nn.GlobalAvgPool()
        self.fc = nn.Linear(in_channels, num_classes)
        self.compute_dtype = None  # the residual stages' dtype: None (the input's), or BF16 (minidl.amp)
        self._init(zero_init_residual)

    def _init(self, zero_init_residual):
        for _, module in self.named_modules():
            if isinstance(module, nn.Conv2d):
                k, r, s, _ = module.weight.shape
                module.weight.data[...] = nn.init_normal(module.weight.shape, math.sqrt(2.0 / (k * r * s)))
            elif zero_init_residual and isinstance(module, (BasicBlock, Bottleneck)):
                module.last_bn.weight.data[...] = 0
        self.fc.weight.data[...] = nn.init_normal(self.fc.weight.shape, 0.01)
        self.fc.bias.data[...] = 0

    def forward(self, x):
        if self.fuse:
            x = ops.bn_add_relu(*conv_stats(self.conv1, x, self.bn1), bn_of(self.bn1))
        else:
            x = bn_relu(self.bn1, self.conv1(x))
        if self.maxpool is not None:
            x = self.maxpool(x)
        x = ops.to_compute_dtype(x, self.compute_dtype)  # the stem stays float32: 3 input channels, float32 pooling kernels
        for index in range(self.num_stages):
            x = getattr(self, f"layer{index + 1}")(x)
        return self.fc(self.avgpool(ops.to_float(x)))


def imagenet_stem():
    """(conv1, bn1, maxpool)"""
    conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
    return conv1, nn.BatchNorm2d(64), nn.MaxPool2d(3, stride=2, padding=1)


def cifar_stem(width=16):
    """(conv1, bn1, no pooling)"""
    return conv3x3(3, width), nn.BatchNorm2d(width), None


def _imagenet_resnet(block, stage_blocks):
    def build(num_classes=1000, zero_init_residual=False, fuse=False):
        return ResNet(imagenet_stem(), block, (64, 128, 256, 512), stage_blocks, num_classes, zero_init_residual,
                      fuse)
    return build


def _cifar_resnet(depth, width=16):
    def build(num_classes=10, zero_init_residual=False, fuse=False):
        return ResNet(cifar_stem(width), BasicBlock, (width, 2 * width, 4 * width), [(depth - 2) // 6] * 3,
                      num_classes, zero_init_residual, fuse)
    return build


MODELS = {
    "resnet18": _imagenet_resnet(BasicBlock, (2, 2, 2, 2)),
    "resnet34": _imagenet_resnet(BasicBlock, (3, 4, 6, 3)),
    "resnet50": _imagenet_resnet(Bottleneck, (3, 4, 6, 3)),
    "resnet101": _imagenet_resnet(Bottleneck, (3, 4, 23, 3)),
    "resnet152": _imagenet_resnet(Bottleneck, (3, 8, 36, 3)),
    "resnet8_w8": _cifar_resnet(8, width=8),
    "resnet20": _cifar_resnet(20),
    "resnet32": _cifar_resnet(32),
    "resnet56": _cifar_resnet(56),
}
