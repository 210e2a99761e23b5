"""Checkpoints of a training state: HDF5 files written atomically and checked on load.

A checkpoint holds named arrays and JSON metadata, with a sha256 checksum over both that
notices a flipped bit or a half-copied file. The file is built in memory and written
atomically (fileio.write_bytes_atomic), so a crash never leaves half of one. `CheckpointDir`
names, prunes and finds the checkpoints of an output directory; `training_state` /
`restore_training_state` gather and put back what a model and its optimizer carry.

Details: docs/training.md, "minidl/checkpoint.py".
"""
import hashlib
import io
import json
import re
import sys
from pathlib import Path

import h5py
import numpy

from minidl.backend import get_array_module, to_numpy
from minidl.errors import UserError
from minidl.fileio import write_bytes_atomic

FORMAT = "minidl-checkpoint"
FORMAT_VERSION = 1
REGULAR_NAME = re.compile(r"checkpoint-e(\d+)-i(\d+)\.h5")
# the flat parameter and momentum buffers: their zero padding past the parameters depends on
# the grid of ranks (the all-reduce's alignment), so they restore into any padded length
FLAT_BUFFERS = ("optimizer/params", "optimizer/momentum")
UNREADABLE_FIX = "resume from an older checkpoint of the same run or start a new --output-dir"


def _json_default(value):
    if isinstance(value, numpy.generic):  # numpy scalars (a rate, a count) are fine as numbers
        return value.item()
    raise TypeError(f"{type(value).__name__} in checkpoint metadata: put arrays in `arrays`, not `meta`")


def checksum(arrays, meta_bytes):
    """sha256 hex over every array (name, dtype, shape, bytes; sorted by name) and the meta bytes."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = numpy.ascontiguousarray(arrays[name])
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(memoryview(array.reshape(-1)).cast("B"))
    digest.update(meta_bytes)
    return digest.hexdigest()


def save_checkpoint(path, arrays, meta):
    """Write `arrays` (name -> NumPy or CuPy array; copied to the host) and `meta` (a JSON-able
    dict) to `path` atomically. Arrays come back bit for bit, `meta` as JSON gives it back."""
    bad = [name for name in arrays if not name or name.startswith("/") or "//" in name]
    if bad:  # h5py would file these outside /arrays, and the load would call the file corrupt
        raise ValueError(f"checkpoint array names are relative paths like 'buffers/bn1.running_mean', got {bad[0]!r}")
    host = {name: numpy.ascontiguousarray(to_numpy(array)) for name, array in arrays.items()}
    meta_bytes = json.dumps(meta, sort_keys=True, default=_json_default).encode()
    image = io.BytesIO()
    with h5py.File(image, "w") as f:
        f.attrs["format"], f.attrs["version"] = FORMAT, FORMAT_VERSION
        f.attrs["sha256"] = checksum(host, meta_bytes)
        group = f.create_group("arrays")
        for name, array in host.items():
            group.create_dataset(name, data=array)
        f.create_dataset("meta", data=numpy.frombuffer(meta_bytes, dtype=numpy.uint8))
    write_bytes_atomic(path, image.getbuffer())


def _read(f, path):
    if f.attrs.get("format") != FORMAT:
        raise UserError(f"{path} is an HDF5 file but not a minidl checkpoint: pass a checkpoint-*.h5 "
                        "file that minidl wrote")
    version = f.attrs.get("version")
    if version != FORMAT_VERSION:
        raise UserError(f"checkpoint {path} has format version {version}, this minidl reads version "
                        f"{FORMAT_VERSION}: resume it with the minidl that wrote it or start a new --output-dir")
    arrays = {}

    def collect(name, item):
        if isinstance(item, h5py.Dataset):
            arrays[name] = numpy.asarray(item[()])
    f["arrays"].visititems(collect)
    return arrays, bytes(f["meta"][()]), str(f.attrs["sha256"])


def load_checkpoint(path):
    """(arrays as NumPy, meta) from a checkpoint file. Raises UserError, one line naming the file,
    when it is missing, not HDF5, truncated, corrupt (checksum) or of another format version."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise UserError(f"checkpoint {path} {what}: pass the path of a checkpoint-*.h5 file "
                        "(or --resume auto for the newest one in --output-dir)")
    try:
        with h5py.File(path, "r") as f:
            arrays, meta_bytes, stored = _read(f, path)
    except (OSError, KeyError, ValueError, RuntimeError) as error:
        reason = " ".join(str(error).split())  # h5py's messages can span lines
        raise UserError(f"checkpoint {path} is unreadable, truncated or not HDF5 ({reason}): {UNREADABLE_FIX}")
    if checksum(arrays, meta_bytes) != stored:
        raise UserError(f"checkpoint {path} is corrupt (its contents do not match its sha256 checksum): "
                        f"{UNREADABLE_FIX}")
    return arrays, json.loads(meta_bytes)


def _describe(model, count):
    return f"{model} ({count:,} parameters)" if isinstance(count, int) else f"{model} (? parameters)"


def check_compatible(path, meta, model_name, parameter_count):
    """Raise UserError unless the checkpoint's meta["model"] and meta["parameter_count"] are this
    run's (the parameter count also tells a different number of classes apart)."""
    found = (meta.get("model"), meta.get("parameter_count"))
    if found != (model_name, parameter_count):
        raise UserError(f"checkpoint {path} is for {_describe(*found)}, this run builds "
                        f"{_describe(model_name, parameter_count)}: resume with the same --model "
                        "(and dataset) or start a new --output-dir")


# --- the state a model and its optimizer carry between steps ---------------------------------

def training_state(model, optimizer):
    """(arrays, meta) to put in a checkpoint: the flat parameter and momentum buffers, every
    buffer of the model (BN running statistics), and the optimizer's scalar state. The arrays
    are the live ones, not copies; `save_checkpoint` copies them to the host."""
    arrays = dict(zip(FLAT_BUFFERS, (optimizer.flat.data, optimizer.velocity)))
    arrays.update((f"buffers/{name}", array) for name, array in model.named_buffers())
    # an update with the rate inside the momentum rescales it when the rate changes
    meta = {"optimizer": type(optimizer).__name__, "parameter_count": model.num_parameters(),
            "previous_lr": optimizer.previous_lr}
    return arrays, meta


def restore_training_state(path, arrays, meta, model, optimizer):
    """Copy a checkpoint's training state into `model` and `optimizer` IN PLACE (parameters stay
    views into the flat buffer). Raises UserError naming the first array that does not fit."""
    if meta.get("optimizer") != type(optimizer).__name__:
        raise UserError(f"checkpoint {path} was written with optimizer {meta.get('optimizer')}, this run "
                        f"uses {type(optimizer).__name__}: resume with the same --opt or start a new --output-dir")
    targets, _ = training_state(model, optimizer)
    used = optimizer.flat.size
    for name, target in targets.items():
        found = arrays.get(name)
        if found is None or not _fits(name, found, target, used):
            what = "lacks" if found is None else f"has {found.dtype}{list(found.shape)} for"
            raise UserError(f"checkpoint {path} {what} {name} ({target.dtype}{list(target.shape)} expected): "
                            "resume with the same --model and dataset or start a new --output-dir")
    for name, target in targets.items():
        found = get_array_module(target).asarray(arrays[name])
        if found.shape == target.shape:
            target[...] = found
        else:  # a flat buffer padded for another grid of ranks
            target[:used], target[used:] = found[:used], 0
    optimizer.previous_lr = meta.get("previous_lr")


def _fits(name, found, target, used):
    """Whether the array `found` restores into `target`: the same dtype and shape, or for a flat
    buffer padded for another grid of ranks, the `used` elements followed by zeros."""
    if found.dtype != target.dtype:
        return False
    if found.shape == target.shape:
        return True
    return name in FLAT_BUFFERS and found.ndim == 1 and len(found) >= used and not found[used:].any()


# --- the checkpoints of one output directory -------------------------------------------------

def _warn(message):
    print(f"minidl: warning: {message}", file=sys.stderr, flush=True)


class CheckpointDir:
    """Regular checkpoints `checkpoint-e{epoch:03d}-i{iteration:08d}.h5`, of which `save` keeps the
    newest `keep` (by iteration); diagnostic ones `checkpoint-{label}-i{iteration:08d}[-n].h5`,
    never pruned, never overwritten and never taken for a regular one."""

    def __init__(self, output_dir, keep):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.dir, self.keep = Path(output_dir), keep

    def regular(self):
        """The regular checkpoints, oldest first: [(iteration, epoch, path)]."""
        found = []
        for path in self.dir.glob("checkpoint-e*-i*.h5"):
            match = REGULAR_NAME.fullmatch(path.name)
            if match:
                found.append((int(match[2]), int(match[1]), path))
        return sorted(found)

    def save(self, arrays, meta, epoch, iteration):
        """Write a regular checkpoint, then delete the oldest regular ones beyond `keep` (never
        the one just written) and any temporary file a killed writer left. Returns its path."""
        path = self.dir / f"checkpoint-e{epoch:03d}-i{iteration:08d}.h5"
        save_checkpoint(path, arrays, meta)
        others = [p for _, _, p in self.regular() if p != path]
        stale = others[:max(0, len(others) - (self.keep - 1))] + list(self.dir.glob(".checkpoint-*.tmp"))
        for old in stale:
            old.unlink(missing_ok=True)
        return path

    def save_diagnostic(self, arrays, meta, iteration, label="nonfinite"):
        """Write a checkpoint for a post-mortem (e.g. the state at a non-finite loss) under a
        new name; returns its path."""
        if not re.fullmatch(r"[a-z]+", label):
            raise ValueError(f"a diagnostic label is lower-case letters, got {label!r}")
        stem = f"checkpoint-{label}-i{iteration:08d}"
        path, n = self.dir / f"{stem}.h5", 1
        while path.exists():
            path, n = self.dir / f"{stem}-{n}.h5", n + 1
        save_checkpoint(path, arrays, meta)
        return path

    def load_latest(self, warn=_warn):
        """(path, arrays, meta) of the newest readable regular checkpoint, or None where there is
        none (a fresh start). A newer unreadable one is skipped with a line through `warn`, so
        a crash or a bad disk costs the steps since the previous checkpoint, not the run; if
        none is readable, UserError."""
        candidates = self.regular()
        for _, _, path in reversed(candidates):
            try:
                return (path, *load_checkpoint(path))
            except UserError as error:
                warn(f"{error} (skipped: trying an older one)")
        if candidates:
            raise UserError(f"none of the {len(candidates)} checkpoints in {self.dir} is readable: "
                            "move them away to start afresh, or start a new --output-dir")
        return None
