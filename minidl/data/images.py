"""Encoded images: the dataset interface shared by image folders and HDF5 shards, and decoding.

A dataset holds encoded image files (JPEG or PNG bytes) and their labels. `dataset[i]` opens
image i lazily (only its header is parsed), so that a transform can ask the JPEG decoder for a
reduced size before any pixel is decoded (`decode`): decoding at 1/2, 1/4 or 1/8 scale skips
most of the inverse DCT work, which dominates the cost of a full-size ImageNet JPEG.

An image that cannot be decoded raises `BadImage`; the loader skips it (see loader.py).
"""

import io
import math

import numpy as np
from PIL import Image, UnidentifiedImageError

from minidl.errors import UserError


class BadImage(UserError):
    """Image bytes that cannot be decoded (corrupt, truncated, not an image at all)."""


def open_image(data):
    """A PIL image of the encoded bytes `data`, opened lazily; raise BadImage if it is none."""
    try:
        return Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise BadImage("not a JPEG or PNG image") from None
    except Exception as e:  # PIL raises many kinds for a damaged header
        raise BadImage(f"damaged image header ({e})") from None


def decode(image, box, size):
    """Decode a lazily opened image as RGB, as small as keeps `box` at least `size` = (w, h).

    A JPEG is decoded at the smallest DCT scale (1, 1/2, 1/4, 1/8) at which the region `box`
    (left, top, right, bottom, in the full image's coordinates) still spans `size` pixels;
    other formats at full size. Returns the RGB image and `box` in its coordinates.
    """
    width, height = image.size
    request = (math.ceil(width * size[0] / (box[2] - box[0])),
               math.ceil(height * size[1] / (box[3] - box[1])))
    try:
        drafted = image.draft("RGB", request)
        rgb = image.convert("RGB")  # the actual decoding
    except Exception as e:  # any failure while decoding the bytes means a damaged image
        raise BadImage(f"cannot decode ({e})") from None
    if drafted is None:
        return rgb, box
    scale = drafted[1][2] / width  # draft's box is the full image in the reduced coordinates
    return rgb, tuple(c * scale for c in box)


class ImageDataset:
    """Encoded images with labels 0..len(classes)-1; subclasses implement `read` and `source`.

    `labels` is a NumPy array and subclasses keep their file lists in NumPy arrays too:
    worker processes share them with the parent copy-on-write, and unlike a list of Python
    objects, reading them touches no reference counts, so the pages stay shared.
    """

    classes: list
    labels: np.ndarray

    def read(self, i):
        """The encoded bytes of image i."""
        raise NotImplementedError

    def source(self, i):
        """Where image i comes from, for messages."""
        raise NotImplementedError

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        """(image i opened lazily, its label); raises BadImage if it is not an image."""
        return open_image(self.read(i)), int(self.labels[i])
