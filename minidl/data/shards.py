"""The HDF5 shard format that data/prepare_imagenet.py writes and HDF5Dataset reads.

A prepared folder holds `index.json` (written last, atomically) and, per split, shards
`<split>-00000.h5`, ... Each shard holds `count` images in the order of their source folder:
`encoded` (every image's encoded file, one after another), `offsets`, `labels` and `names`.
`encoded` is chunked in CHUNK_BYTES pieces, so a shard is written image by image and reading
one image touches about its own size of the file.

Details: docs/data.md, "minidl/data/shards.py".
"""

import hashlib
import json
import os
from pathlib import Path

import h5py
import numpy as np

from minidl.errors import UserError

FORMAT = "minidl-image-shards"
VERSION = 1
INDEX = "index.json"
CHUNK_BYTES = 1 << 16


def shard_file(split, number):
    return f"{split}-{number:05d}.h5"


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def write_shard(path, images, labels, names):
    """Write a shard at `path` atomically from the iterable of encoded `images`; its sha256.

    The shard is written under a temporary name in the same folder, flushed to disk and only
    then renamed: a file under a shard's name is always complete.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"], f.attrs["version"] = FORMAT, VERSION
            encoded = f.create_dataset("encoded", (0,), np.uint8, maxshape=(None,),
                                       chunks=(CHUNK_BYTES,))
            offsets = [0]
            for data in images:
                encoded.resize((offsets[-1] + len(data),))
                encoded[offsets[-1]:] = np.frombuffer(data, np.uint8)
                offsets.append(offsets[-1] + len(data))
            f["offsets"] = np.array(offsets, np.int64)
            f["labels"] = np.asarray(labels, np.int64)
            f.create_dataset("names", data=list(names), dtype=h5py.string_dtype())
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        checksum = sha256_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return checksum


def is_temporary(name):
    """Whether `name` is a shard's temporary file (what a killed writer leaves behind)."""
    return name.startswith(".") and ".h5.tmp-" in name


def read_index(root):
    """The parsed index.json of a prepared folder; UserError if missing or not ours."""
    path = Path(root) / INDEX
    try:
        index = json.loads(path.read_text())
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror}): point --data-path at a folder made "
                        "by data/prepare_imagenet.py") from None
    except ValueError:
        raise UserError(f"{path} is not valid JSON: re-run data/prepare_imagenet.py to "
                        "rewrite it") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise UserError(f"{path} is not a {FORMAT} index: point --data-path at a folder made "
                        "by data/prepare_imagenet.py")
    if index.get("version") != VERSION:
        raise UserError(f"{path} has format version {index.get('version')}, this minidl reads "
                        f"{VERSION}: re-run data/prepare_imagenet.py into a new folder")
    return index
