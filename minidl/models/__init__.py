"""Model zoo: `minidl.models.resnet50(num_classes=1000)` and friends; `MODELS` maps names to builders;
`export_torchvision` / `import_torchvision` move weights to and from PyTorch."""
from minidl.models.interop import export_torchvision, import_torchvision
from minidl.models.resnet import MODELS, BasicBlock, Bottleneck, ResNet

globals().update(MODELS)  # resnet18 ... resnet152, resnet20/32/56, resnet8_w8 as module attributes

__all__ = ["MODELS", "BasicBlock", "Bottleneck", "ResNet", "export_torchvision", "import_torchvision", *MODELS]
