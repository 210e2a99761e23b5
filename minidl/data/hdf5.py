"""The images of one split, read from the HDF5 shards that data/prepare_imagenet.py made.

Making the dataset opens every shard of the split once, which finds a missing, truncated or
foreign shard before training starts, and keeps each shard's offsets and labels in memory
(16 bytes per image). Shard files are then opened lazily, by whichever process reads them:
each loader worker opens its own handles after it was forked (HDF5 handles must not cross a
fork), at most MAX_OPEN at a time.
"""

import collections
import os
from pathlib import Path

import h5py
import numpy as np

from minidl.data.images import ImageDataset
from minidl.data.shards import read_index
from minidl.errors import UserError

MAX_OPEN = 256  # shard files one process keeps open, least recently used closed first


def _rebuild_hint(root):
    return f"re-run data/prepare_imagenet.py SRC {root} to rebuild it"


class HDF5Dataset(ImageDataset):
    def __init__(self, root, split):
        self.root = Path(root)
        self.split = split
        index = read_index(root)
        if split not in index["splits"]:
            raise UserError(f"{self.root} holds no {split} shards: {_rebuild_hint(self.root)}")
        self.classes = index["classes"]
        self.files = [self.root / s["file"] for s in index["splits"][split]["shards"]]
        offsets, labels = zip(*(self._load(path, s["images"])
                                for path, s in zip(self.files, index["splits"][split]["shards"])))
        self.offsets = offsets
        self.labels = np.concatenate(labels)
        self.starts = np.cumsum([0] + [len(x) for x in labels])  # first global index per shard
        self._pid, self._open = None, collections.OrderedDict()

    def _load(self, path, count):
        """(offsets, labels) of one shard, checking that it opens and holds `count` images."""
        try:
            with h5py.File(path, "r") as f:
                offsets, labels = f["offsets"][:], f["labels"][:]
                size = f["encoded"].shape[0]
        except (OSError, KeyError) as e:
            raise UserError(f"shard {path} is missing, truncated or unreadable ({e}): "
                            f"{_rebuild_hint(self.root)}") from None
        if not len(labels) == len(offsets) - 1 == count or offsets[-1] != size:
            raise UserError(f"shard {path} does not hold the {count} images {self.root}/index.json "
                            f"lists: {_rebuild_hint(self.root)}")
        return offsets, labels

    def _file(self, shard):
        """An open handle of shard `shard` for this process, and its `encoded` dataset."""
        if self._pid != os.getpid():  # new here, or inherited through a fork: not ours to use
            self._pid, self._open = os.getpid(), collections.OrderedDict()
        if shard in self._open:
            self._open.move_to_end(shard)
        else:
            if len(self._open) == MAX_OPEN:
                self._open.popitem(last=False)[1][0].close()
            handle = h5py.File(self.files[shard], "r")
            self._open[shard] = handle, handle["encoded"]  # a group lookup costs a read's time
        return self._open[shard]

    def _locate(self, i):
        shard = int(np.searchsorted(self.starts, i, side="right")) - 1
        return shard, i - self.starts[shard]

    def read(self, i):
        shard, k = self._locate(i)
        start, stop = self.offsets[shard][k:k + 2].tolist()  # h5py slices Python ints faster
        try:
            return self._file(shard)[1][start:stop].tobytes()
        except OSError as e:
            raise UserError(f"cannot read shard {self.files[shard]} ({e}): "
                            f"{_rebuild_hint(self.root)}") from None

    def source(self, i):
        shard, k = self._locate(i)
        name = self._file(shard)[0]["names"][k].decode()
        return f"{name} (image {k} of shard {self.files[shard]})"
