"""Image folders in the ImageNet layout: root/train/<class>/<images>, root/val/<class>/<images>."""

import os
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from minidl.errors import UserError

SPLITS = ("train", "val")
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")
LAYOUT = "train/<class>/ and val/<class>/ image folders"


def _is_image(entry):
    return entry.is_file() and entry.name.lower().endswith(IMAGE_EXTENSIONS)


def _class_names(root, split):
    """The sorted class folder names of root/split; raise UserError if any is missing or empty."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"data path {root} does not exist: point it at a folder with {LAYOUT}")
    split_dir = root / split
    if not split_dir.is_dir():
        raise UserError(f"data path {root} has no {split}/ folder: point it at a folder with "
                        f"{LAYOUT}")
    # Hidden folders (.ipynb_checkpoints and the like) are not classes.
    folders = sorted((e for e in os.scandir(split_dir)
                      if e.is_dir() and not e.name.startswith(".")), key=lambda e: e.name)
    if not folders:
        raise UserError(f"{split_dir} has no class folders: put each class's images in "
                        f"{split_dir}/<class>/")
    for folder in folders:
        with os.scandir(folder.path) as entries:
            if not any(_is_image(e) for e in entries):
                raise UserError(f"class folder {folder.path} holds no .jpeg/.jpg/.png images: "
                                "add images or remove the folder")
    return [f.name for f in folders]


def check_folder_layout(root):
    """The class names; raise UserError unless train/ and val/ hold the same non-empty ones."""
    train, val = (_class_names(root, split) for split in SPLITS)
    if train != val:
        only_train = sorted(set(train) - set(val))
        only_val = sorted(set(val) - set(train))
        raise UserError(f"{root}: train/ and val/ have different class folders (only in "
                        f"train: {_some(only_train)}; only in val: {_some(only_val)}): give "
                        "both the same class folders")
    return train


def _some(names, limit=5):
    shown = ", ".join(names[:limit]) or "none"
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


class FolderDataset:
    """The images of one split; a class's label is its position in the sorted class names."""

    def __init__(self, root, split):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        self.root = Path(root)
        self.split = split
        # Checking both splits makes a label mean the same class in train and val.
        self.classes = check_folder_layout(root)
        self.samples = [(Path(e.path), label) for label, name in enumerate(self.classes)
                        for e in sorted(os.scandir(self.root / split / name),
                                        key=lambda e: e.name)
                        if _is_image(e)]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        try:
            with Image.open(path) as image:
                return image.convert("RGB"), label
        except (UnidentifiedImageError, OSError) as e:
            raise UserError(f"cannot decode image {path} ({e}): replace or delete it") from None
