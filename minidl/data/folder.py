"""Image folders in the ImageNet layout: root/train/<class>/<images>, root/val/<class>/<images>.

Each split's files are listed once (1.28M of them for ImageNet's train/), when its dataset is
made; the checks that span both splits only list the class folders.
"""

import os
from pathlib import Path

import numpy as np

from minidl.data.images import BadImage, ImageDataset
from minidl.errors import UserError

SPLITS = ("train", "val")
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")
LAYOUT = "train/<class>/ and val/<class>/ image folders"


def is_image(entry):
    return entry.is_file() and entry.name.lower().endswith(IMAGE_EXTENSIONS)


def _split_dir(root, split):
    root = Path(root)
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "does not exist"
        raise UserError(f"data path {root} {what}: point it at a folder with {LAYOUT}")
    split_dir = root / split
    if not split_dir.is_dir():
        raise UserError(f"data path {root} has no {split}/ folder: point it at a folder with "
                        f"{LAYOUT}")
    return split_dir


def class_names(root, split):
    """The sorted class folder names of root/split (hidden folders are not classes)."""
    split_dir = _split_dir(root, split)
    names = sorted(e.name for e in os.scandir(split_dir)
                   if e.is_dir() and not e.name.startswith("."))
    if not names:
        raise UserError(f"{split_dir} has no class folders: put each class's images in "
                        f"{split_dir}/<class>/")
    return names


def _empty_class_error(folder):
    return UserError(f"class folder {folder} holds no .jpeg/.jpg/.png images: add images or "
                     "remove the folder")


def scan_split(root, split):
    """(class names, image file names per class, sorted) of root/split, listing each folder once."""
    split_dir = _split_dir(root, split)
    classes = class_names(root, split)
    files = []
    for name in classes:
        with os.scandir(split_dir / name) as entries:
            images = sorted(e.name for e in entries if is_image(e))
        if not images:
            raise _empty_class_error(split_dir / name)
        files.append(images)
    return classes, files


def check_same_classes(root, train, val):
    if train != val:
        only_train = sorted(set(train) - set(val))
        only_val = sorted(set(val) - set(train))
        raise UserError(f"{root}: train/ and val/ have different class folders (only in "
                        f"train: {_some(only_train)}; only in val: {_some(only_val)}): give "
                        "both the same class folders")


def _some(names, limit=5):
    shown = ", ".join(names[:limit]) or "none"
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_folder_layout(root):
    """The class names; raise UserError unless train/ and val/ hold the same non-empty ones.

    Looks only as far as the first image of each class folder, not through whole folders.
    """
    classes = {split: class_names(root, split) for split in SPLITS}
    check_same_classes(root, classes["train"], classes["val"])
    for split in SPLITS:
        for name in classes[split]:
            folder = Path(root) / split / name
            with os.scandir(folder) as entries:
                if not any(is_image(e) for e in entries):
                    raise _empty_class_error(folder)
    return classes["train"]


class FolderDataset(ImageDataset):
    """The images of one split; a class's label is its position in the sorted class names.

    Making it lists this split's files and the other split's class folders (to check that a
    label means the same class in train and val).
    """

    def __init__(self, root, split):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        self.root = Path(root)
        self.split = split
        self.classes, files = scan_split(root, split)
        other = class_names(root, SPLITS[1 - SPLITS.index(split)])
        check_same_classes(self.root, *((self.classes, other) if split == "train"
                                         else (other, self.classes)))
        self.labels = np.repeat(np.arange(len(files), dtype=np.int64), [len(f) for f in files])
        self.names = np.array([os.fsencode(name) for names in files for name in names])

    def path(self, i):
        return self.root / self.split / self.classes[self.labels[i]] / os.fsdecode(self.names[i])

    def read(self, i):
        try:
            return self.path(i).read_bytes()
        except OSError as e:  # deleted or made unreadable since the listing
            raise BadImage(f"cannot read ({e.strerror})") from None

    def source(self, i):
        return str(self.path(i))
