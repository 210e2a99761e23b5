"""The training configuration: every knob of a run, its defaults, and its validation.

Fields left as None are filled from a profile: the embedded default (a small CIFAR-style
ResNet on the embedded dataset, minutes on a laptop CPU) when no data path is given,
ImageNet's (torchvision's reference recipe) when one is. Explicit values always win.
Validation raises UserError with one line naming the problem and the fix.
"""
import dataclasses
import os
from pathlib import Path

from minidl.data import TRAIN_TRANSFORMS
from minidl.errors import UserError
from minidl.models import MODELS
from minidl.schedule import LR_SCHEDULERS

EMBEDDED_PROFILE = dict(model="resnet20", batch_size=128, epochs=10, weight_decay=5e-4,
                        train_crop_size=32, val_crop_size=32, val_resize_size=32, augment="cifar")
IMAGENET_PROFILE = dict(model="resnet50", batch_size=32, epochs=90, weight_decay=1e-4,
                        train_crop_size=224, val_crop_size=224, val_resize_size=256, augment="imagenet")


def default_cache_dir():
    return os.environ.get("MINIDL_CACHE") or str(Path.home() / ".cache" / "minidl")


@dataclasses.dataclass
class Config:
    data_path: str | None = None
    model: str | None = None
    batch_size: int | None = None  # per process
    epochs: int | None = None
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float | None = None
    norm_weight_decay: float | None = None  # None: the same as weight_decay
    nesterov: bool = False
    label_smoothing: float = 0.0
    lr_scheduler: str = "cosine"
    lr_steps: tuple = (30, 60, 80)
    lr_gamma: float = 0.1
    train_crop_size: int | None = None
    val_crop_size: int | None = None
    val_resize_size: int | None = None
    augment: str | None = None
    output_dir: str = "runs/latest"
    cache_dir: str = dataclasses.field(default_factory=default_cache_dir)
    seed: int = 0
    print_freq: int = 10
    workers: int = 0

    def resolved(self):
        """A copy with the profile's defaults filled in, validated."""
        profile = IMAGENET_PROFILE if self.data_path else EMBEDDED_PROFILE
        filled = {k: v for k, v in profile.items() if getattr(self, k) is None}
        config = dataclasses.replace(self, **filled)
        config.validate()
        return config

    def validate(self):
        if self.model not in MODELS:
            raise UserError(f"unknown model {self.model!r}: choose one of {', '.join(MODELS)}")
        for flag, value in (("--batch-size", self.batch_size), ("--epochs", self.epochs),
                            ("--print-freq", self.print_freq), ("--train-crop-size", self.train_crop_size),
                            ("--val-crop-size", self.val_crop_size), ("--val-resize-size", self.val_resize_size)):
            if value is None or value <= 0:
                raise UserError(f"{flag} must be a positive integer, got {value}")
        if not self.lr > 0:
            raise UserError(f"--lr must be positive, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise UserError(f"--momentum must be in [0, 1), got {self.momentum}")
        for flag, value in (("--wd", self.weight_decay), ("--norm-weight-decay", self.norm_weight_decay)):
            if value is not None and value < 0:
                raise UserError(f"{flag} must be >= 0, got {value}")
        if self.nesterov and self.momentum == 0:
            raise UserError("--nesterov needs a positive --momentum")
        if not 0 <= self.label_smoothing < 1:
            raise UserError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.lr_scheduler not in LR_SCHEDULERS:
            raise UserError(f"unknown --lr-scheduler {self.lr_scheduler!r}: choose one of {', '.join(LR_SCHEDULERS)}")
        if not 0 < self.lr_gamma <= 1:
            raise UserError(f"--lr-gamma must be in (0, 1], got {self.lr_gamma}")
        if list(self.lr_steps) != sorted(self.lr_steps) or any(step <= 0 for step in self.lr_steps):
            raise UserError(f"--lr-steps must be increasing positive epochs, got {','.join(map(str, self.lr_steps))}")
        if self.augment not in TRAIN_TRANSFORMS:
            raise UserError(f"unknown --augment {self.augment!r}: choose one of {', '.join(TRAIN_TRANSFORMS)}")
        if self.val_resize_size < self.val_crop_size:
            raise UserError(f"--val-resize-size {self.val_resize_size} is smaller than --val-crop-size "
                            f"{self.val_crop_size}: make it at least the crop size")
        if self.workers < 0:
            raise UserError(f"--workers must be >= 0, got {self.workers}")

    def to_dict(self):
        return dataclasses.asdict(self)
