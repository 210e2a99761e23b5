"""Augmentations: PIL image + numpy Generator -> uint8 HWC array; and normalization.

A transform is a picklable callable `transform(image, rng)` (loader workers receive it) whose
output has the shape `transform.output_shape`, and takes all of its randomness from `rng`, so
the loader decides what is random and how it is seeded. The image may be opened lazily: the
transform decodes it (`decode`), at a reduced JPEG scale where its output allows.
"""

import functools
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from minidl.data.images import decode
from minidl.errors import UserError

# ImageNet channel statistics on the 0-255 scale, RGB order.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
TRAIN_TRANSFORMS = ("imagenet", "cifar", "none")


def _resize(image, box, size):
    """The `box` region of `image` resized to `size` = (w, h).

    A region that already has that size is only cropped, never resampled.
    """
    if (box[2] - box[0], box[3] - box[1]) == size:
        return image.crop(box)
    return image.resize(size, Image.Resampling.BILINEAR, box=box)


def _flip(array, rng):
    """Horizontal flip with probability 1/2."""
    return array[:, ::-1] if rng.random() < 0.5 else array


@dataclass(frozen=True)
class CenterCrop:
    """Resize the short side to `resize_size`, then take the central `crop_size` square."""
    resize_size: int
    crop_size: int

    @property
    def output_shape(self):
        return self.crop_size, self.crop_size, 3

    def __call__(self, image, rng=None):
        width, height = image.size
        # The sizes and rounding of torchvision's Resize(int) and CenterCrop.
        long = int(self.resize_size * max(width, height) / min(width, height))
        w, h = (self.resize_size, long) if width <= height else (long, self.resize_size)
        top = int(round((h - self.crop_size) / 2))
        left = int(round((w - self.crop_size) / 2))
        # Resampling only the crop's source region gives the pixels of resize-then-crop (the
        # filter may read beyond the box), without computing the pixels the crop discards.
        sx, sy = width / w, height / h
        box = (left * sx, top * sy, (left + self.crop_size) * sx, (top + self.crop_size) * sy)
        size = (self.crop_size, self.crop_size)
        return np.asarray(_resize(*decode(image, box, size), size))


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision's RandomResizedCrop (+ horizontal flip): a random area and aspect ratio."""
    size: int
    scale: tuple = (0.08, 1.0)
    ratio: tuple = (3 / 4, 4 / 3)

    def _box(self, width, height, rng):
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return left, top, left + w, top + h
        # Fallback: the whole image, cropped centrally to the nearest allowed aspect ratio.
        w, h = width, height
        if width / height < self.ratio[0]:
            h = int(round(width / self.ratio[0]))
        elif width / height > self.ratio[1]:
            w = int(round(height * self.ratio[1]))
        top, left = (height - h) // 2, (width - w) // 2
        return left, top, left + w, top + h

    @property
    def output_shape(self):
        return self.size, self.size, 3

    def __call__(self, image, rng):
        box = self._box(*image.size, rng)
        size = (self.size, self.size)
        return _flip(np.asarray(_resize(*decode(image, box, size), size)), rng)


@dataclass(frozen=True)
class PadCrop:
    """The CIFAR augmentation: zero-pad by `pad`, take a random `size` crop, flip."""
    size: int
    pad: int = 4

    @property
    def output_shape(self):
        return self.size, self.size, 3

    def __call__(self, image, rng):
        array = CenterCrop(self.size, self.size)(image)  # a no-op on size x size images
        padded = np.pad(array, ((self.pad, self.pad), (self.pad, self.pad), (0, 0)))
        top, left = rng.integers(0, 2 * self.pad + 1, 2)
        return _flip(padded[top:top + self.size, left:left + self.size], rng)


def build_transform(kind, crop_size):
    """The training transform `kind` ("imagenet", "cifar" or "none") producing crop_size^2."""
    if kind == "imagenet":
        return RandomResizedCrop(crop_size)
    if kind == "cifar":
        return PadCrop(crop_size)
    if kind == "none":
        return CenterCrop(crop_size, crop_size)
    raise UserError(f"unknown augmentation {kind!r}: choose one of {', '.join(TRAIN_TRANSFORMS)}")


def build_val_transform(resize_size, crop_size):
    """The validation transform: short side to resize_size, central crop_size square."""
    if resize_size < crop_size:
        raise UserError(f"validation resize size {resize_size} is smaller than the crop size "
                        f"{crop_size}: make the resize size at least the crop size")
    return CenterCrop(resize_size, crop_size)


def normalize(batch, xp, mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype=np.float32):
    """(batch - mean) / std per channel of a uint8 NHWC batch, as `dtype` in the module `xp`.

    The conversion to float happens after the move to `xp`, so only uint8 crosses to a GPU.
    """
    shift, scale = _channel_constants(xp, tuple(mean), tuple(std), np.dtype(dtype))
    x = xp.asarray(batch).astype(dtype)
    x -= shift
    x *= scale
    return x


@functools.lru_cache(maxsize=None)
def _channel_constants(xp, mean, std, dtype):
    """(mean, 1/std) as `dtype` arrays of `xp`, made once: on a GPU no copy from the host per
    batch, so a captured CUDA graph (minidl.graph) can normalize too."""
    return xp.asarray(mean, dtype=dtype), xp.asarray([1 / s for s in std], dtype=dtype)
