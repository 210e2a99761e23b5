"""Pack an ImageNet-layout folder into HDF5 shards that `minidl-train --data-path DST` reads.

    minidl-prepare-imagenet SRC DST [--resize 160] [--val-labels LOC_val_solution.csv]

Shards are made in parallel (--workers), each written under a temporary name and renamed,
with a sidecar `<shard>.json` (checksum, fingerprint). Re-running the same command resumes,
keeping every shard that verifies. index.json is written last: until it exists the folder is
not a dataset.

Details: docs/data.md, "minidl/data/prepare_imagenet.py".
"""

import hashlib
import io
import json
import multiprocessing
import os
import re
import signal
import sys
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from minidl.cli import OneLineErrorParser
from minidl.data.folder import SPLITS, check_same_classes, class_names, is_image, scan_split
from minidl.data.shards import (FORMAT, INDEX, VERSION, is_temporary, sha256_file, shard_file,
                                write_shard)
from minidl.errors import UserError
from minidl.fileio import write_json_atomic


def parse_args(argv, prog):
    p = OneLineErrorParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="ImageNet-layout folder (train/<wnid>/, val/)")
    p.add_argument("dst", type=Path, help="folder for the shards and index.json")
    p.add_argument("--resize", type=int, default=None,
                   help="re-encode images whose short side is longer to this short side "
                        "(default: keep every file's bytes as they are)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality when re-encoding")
    p.add_argument("--shard-size", type=int, default=10000, help="images per shard")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="shards made at once")
    p.add_argument("--val-labels", type=Path, default=None,
                   help="labels of a flat val/ folder: lines 'FILE WNID' or 'FILE,WNID ...' "
                        "(ImageNet's LOC_val_solution.csv)")
    args = p.parse_args(argv)
    for flag, value, low in (("--resize", args.resize, 1), ("--quality", args.quality, 1),
                             ("--shard-size", args.shard_size, 1), ("--workers", args.workers, 1)):
        if value is not None and value < low:
            raise UserError(f"{flag} must be a positive integer, got {value}")
    if args.quality > 100:
        raise UserError(f"--quality must be at most 100, got {args.quality}")
    return args


# --- what goes where -------------------------------------------------------------------------

def read_val_labels(path, classes):
    """{file name without extension: label} from a labels file."""
    index = {name: label for label, name in enumerate(classes)}
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read --val-labels {path} ({e}): give a readable text file") from None
    labels = {}
    for number, line in enumerate(lines, 1):
        fields = re.split(r"[,\s]+", line.strip())
        if fields == [""] or fields[0] == "ImageId":  # blank, or the CSV header
            continue
        if len(fields) < 2 or fields[1] not in index:
            raise UserError(f"{path} line {number} names no class of train/ ({line.strip()!r}): "
                            "give lines 'FILE WNID' with the wnids of train/'s folders")
        labels[Path(fields[0]).stem] = index[fields[1]]
    return labels


def _is_flat(folder):
    """Whether `folder` holds files but no folders."""
    if not folder.is_dir():
        return False
    entries = list(os.scandir(folder))
    return any(e.is_file() for e in entries) and not any(e.is_dir() for e in entries)


def split_items(src, split, classes, val_labels):
    """[(path relative to src, label)] of a split, in the order FolderDataset reads them."""
    if split == "val" and val_labels is not None:
        labels = read_val_labels(val_labels, classes)
        if not (src / "val").is_dir():
            raise UserError(f"{src} has no val/ folder: put the validation images in {src / 'val'}")
        names = sorted(e.name for e in os.scandir(src / "val") if is_image(e))
        if not names:
            raise UserError(f"{src / 'val'} holds no images of its own, yet --val-labels is given: "
                            "put the validation images directly in val/, or drop --val-labels")
        missing = [n for n in names if Path(n).stem not in labels]
        if missing:
            more = f" (and for {len(missing) - 1} more images)" if len(missing) > 1 else ""
            raise UserError(f"{src / 'val' / missing[0]} has no label in {val_labels}: add a line "
                            f"'{missing[0]} WNID' for it{more}")
        return [(f"val/{n}", labels[Path(n).stem]) for n in names]
    if split == "val" and _is_flat(src / "val"):
        raise UserError(f"{src / 'val'} holds images but no class folders: give their labels "
                        "with --val-labels FILE")
    split_classes, files = scan_split(src, split)
    if split == "val":
        check_same_classes(src, classes, split_classes)
    return [(f"{split}/{c}/{n}", label)
            for label, (c, names) in enumerate(zip(split_classes, files)) for n in names]


def plan_shards(split, items, args):
    """The shards of a split: file name, items and the fingerprint of what it will hold."""
    shards = []
    for number, start in enumerate(range(0, len(items), args.shard_size)):
        chunk = items[start:start + args.shard_size]
        recipe = json.dumps([VERSION, args.resize, args.quality, chunk])
        shards.append({"file": shard_file(split, number), "items": chunk,
                       "fingerprint": hashlib.sha256(recipe.encode()).hexdigest()})
    return shards


# --- making one shard (in a worker process) --------------------------------------------------

def encode(path, resize, quality):
    """(bytes to store, whether they decode as an image): re-encoded if `resize` asks for it."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror}): fix its permissions or remove it") from None
    try:
        image = Image.open(io.BytesIO(data))
        if resize is None or min(image.size) <= resize:
            return data, True
        scale = resize / min(image.size)
        size = tuple(max(1, round(side * scale)) for side in image.size)
        image.draft("RGB", size)  # decode JPEGs at a reduced scale, still at least `size`
        buffer = io.BytesIO()
        image.convert("RGB").resize(size, Image.Resampling.LANCZOS).save(buffer, "JPEG",
                                                                         quality=quality)
        return buffer.getvalue(), True
    except Exception:  # stored as it is: the loader will skip it, naming the file
        return data, False


def verified(dst, shard):
    """The sidecar of a finished shard whose contents are what `shard` asks for, else None."""
    try:
        record = json.loads((dst / f"{shard['file']}.json").read_text())
        if record["fingerprint"] == shard["fingerprint"] and \
                sha256_file(dst / shard["file"]) == record["sha256"]:
            return record
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def make_shard(task):
    """Keep a verified shard or (re)make it; its sidecar record."""
    src, dst, shard, resize, quality = task
    record = verified(dst, shard)
    if record is not None:
        return record
    undecodable = []

    def images():
        for name, _ in shard["items"]:
            data, ok = encode(src / name, resize, quality)
            if not ok:
                undecodable.append(name)
            yield data

    checksum = write_shard(dst / shard["file"], images(), [label for _, label in shard["items"]],
                           [name for name, _ in shard["items"]])
    record = {"file": shard["file"], "images": len(shard["items"]), "sha256": checksum,
              "fingerprint": shard["fingerprint"], "undecodable": undecodable}
    write_json_atomic(dst / f"{shard['file']}.json", record)
    return record


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the pool


# --- the whole run ---------------------------------------------------------------------------

def remove_temporaries(dst):
    for entry in os.scandir(dst):
        if is_temporary(entry.name):
            os.unlink(entry.path)


def make_all(tasks, workers, total):
    """Run make_shard over tasks on a pool, with a progress bar in images; the records."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    records = {}
    # The pool's exit terminates its workers, also on an error or Ctrl-C.
    with context.Pool(min(workers, len(tasks)), _ignore_sigint) as pool, \
            tqdm(total=total, unit="img", desc="packing", dynamic_ncols=True) as bar:
        for record in pool.imap_unordered(make_shard, tasks):
            records[record["file"]] = record
            bar.update(record["images"])
    return records


def prepare(args):
    src, dst = args.src, args.dst
    classes = class_names(src, "train")
    items = {split: split_items(src, split, classes, args.val_labels) for split in SPLITS}
    shards = {split: plan_shards(split, items[split], args) for split in SPLITS}
    dst.mkdir(parents=True, exist_ok=True)
    (dst / INDEX).unlink(missing_ok=True)  # not a dataset until every shard is in place
    remove_temporaries(dst)
    tasks = [(src, dst, shard, args.resize, args.quality) for split in SPLITS
             for shard in shards[split]]
    try:
        records = make_all(tasks, args.workers, sum(map(len, items.values())))
    finally:
        remove_temporaries(dst)  # what terminated workers left behind
    index = {"format": FORMAT, "version": VERSION, "classes": classes, "resize": args.resize,
             "splits": {split: {
                 "images": len(items[split]),
                 "class_counts": np.bincount([label for _, label in items[split]],
                                             minlength=len(classes)).tolist(),
                 "shards": [{k: records[s["file"]][k] for k in ("file", "images", "sha256")}
                            for s in shards[split]]} for split in SPLITS}}
    write_json_atomic(dst / INDEX, index)
    undecodable = [name for record in records.values() for name in record["undecodable"]]
    return index, undecodable


def main(argv=None, prog="minidl-prepare-imagenet"):
    try:
        args = parse_args(argv, prog)
        index, undecodable = prepare(args)
    except UserError as e:
        sys.stderr.write(f"{prog}: error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted: run the same command again to resume (finished shards are kept)\n")
        return 130
    counts = ", ".join(f"{s['images']:,} {name} images in {len(s['shards'])} shards"
                       for name, s in index["splits"].items())
    print(f"{prog}: {counts}, {len(index['classes'])} classes, in {args.dst}")
    if undecodable:
        print(f"{prog}: {len(undecodable)} images do not decode and were stored as "
              f"they are (training skips them): {', '.join(undecodable[:5])}"
              f"{' ...' if len(undecodable) > 5 else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m minidl.data.prepare_imagenet"))
