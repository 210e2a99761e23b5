"""`open_dataset(path, split)`: the images of a folder of image folders or of HDF5 shards.

A folder with an index.json holds shards (made by data/prepare_imagenet.py); any other is
read as train/<class>/ and val/<class>/ image folders. Both kinds give the same classes,
labels and image bytes for the same source tree, so they give the same batches.
"""

from pathlib import Path

from minidl.data.folder import SPLITS, FolderDataset
from minidl.data.hdf5 import HDF5Dataset
from minidl.data.shards import INDEX


def is_sharded(path):
    return (Path(path) / INDEX).is_file()


def open_dataset(path, split):
    """A FolderDataset or HDF5Dataset of `split`; UserError (one line) if the data is unusable.

    Checks what can be checked before training: for folders, that train/ and val/ exist and
    hold the same non-empty class folders; for shards, that every shard of the split opens.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    return (HDF5Dataset if is_sharded(path) else FolderDataset)(path, split)
