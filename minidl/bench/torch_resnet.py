"""A plain-PyTorch twin of minidl's ResNets (NCHW, torchvision's module names, v1.5 bottleneck,
1×1-conv + BN projection shortcuts): the oracle of the model tests and the peer of the step
benchmark. It uses nothing of minidl, so it can judge it.
"""
import torch.nn as tnn
import torch.nn.functional as F


class TorchBasicBlock(tnn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = tnn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = tnn.BatchNorm2d(planes)
        self.conv2 = tnn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = tnn.BatchNorm2d(planes)
        self.downsample = projection(inplanes, planes, stride)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class TorchBottleneck(tnn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = tnn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = tnn.BatchNorm2d(planes)
        self.conv2 = tnn.Conv2d(planes, planes, 3, stride, 1, bias=False)  # v1.5: stride on the 3x3
        self.bn2 = tnn.BatchNorm2d(planes)
        self.conv3 = tnn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = tnn.BatchNorm2d(planes * 4)
        self.downsample = projection(inplanes, planes * 4, stride)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


def projection(inplanes, outplanes, stride):
    if stride == 1 and inplanes == outplanes:
        return None
    return tnn.Sequential(tnn.Conv2d(inplanes, outplanes, 1, stride, bias=False), tnn.BatchNorm2d(outplanes))


class TorchResNet(tnn.Module):
    def __init__(self, block, blocks, planes, num_classes, imagenet):
        super().__init__()
        width = planes[0]
        if imagenet:
            self.conv1 = tnn.Conv2d(3, width, 7, 2, 3, bias=False)
        else:
            self.conv1 = tnn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = tnn.BatchNorm2d(width)
        self.imagenet = imagenet
        inplanes = width
        for i, (p, n) in enumerate(zip(planes, blocks)):
            layers = []
            for j in range(n):
                layers.append(block(inplanes, p, 2 if (i > 0 and j == 0) else 1))
                inplanes = p * block.expansion
            setattr(self, f"layer{i + 1}", tnn.Sequential(*layers))
        self.num_stages = len(planes)
        self.fc = tnn.Linear(inplanes, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        if self.imagenet:
            x = F.max_pool2d(x, 3, 2, 1)
        for i in range(self.num_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(x.mean(dim=(2, 3)))


def torch_resnet50(num_classes):
    return TorchResNet(TorchBottleneck, (3, 4, 6, 3), (64, 128, 256, 512), num_classes, imagenet=True)


def torch_cifar_resnet(depth, num_classes, width=16):
    n = (depth - 2) // 6
    return TorchResNet(TorchBasicBlock, (n, n, n), (width, 2 * width, 4 * width), num_classes, imagenet=False)


TORCH_TWINS = {
    "resnet18": lambda n: TorchResNet(TorchBasicBlock, (2, 2, 2, 2), (64, 128, 256, 512), n, imagenet=True),
    "resnet34": lambda n: TorchResNet(TorchBasicBlock, (3, 4, 6, 3), (64, 128, 256, 512), n, imagenet=True),
    "resnet50": torch_resnet50,
    "resnet101": lambda n: TorchResNet(TorchBottleneck, (3, 4, 23, 3), (64, 128, 256, 512), n, imagenet=True),
    "resnet152": lambda n: TorchResNet(TorchBottleneck, (3, 8, 36, 3), (64, 128, 256, 512), n, imagenet=True),
    "resnet8_w8": lambda n: torch_cifar_resnet(8, n, width=8),
    "resnet20": lambda n: torch_cifar_resnet(20, n),
    "resnet32": lambda n: torch_cifar_resnet(32, n),
    "resnet56": lambda n: torch_cifar_resnet(56, n),
}


def torch_resnet(name, num_classes):
    """The torch twin of `minidl.models.MODELS[name]`."""
    return TORCH_TWINS[name](num_classes)
