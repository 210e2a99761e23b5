"""`python -m minidl.bench loader`: images/s of JPEG decode + augmentation, against torchvision.

    python -m minidl.bench loader                        # generates full-size JPEGs first
    python -m minidl.bench loader --data-path /data/imagenet --shards /data/imagenet-h5

Each row reads the training split through minidl's DataLoader, from the JPEG folder or its
HDF5 shards, with 1, 2, ... workers, beside torchvision's ImageFolder + DataLoader doing the
same work when it is importable; a row is the median of --repeat runs taken in turns.

Details: docs/data.md, "minidl/bench/loader.py".
"""

import argparse
import collections
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

import minidl
from minidl.environment import cache_dir
from minidl.data import DataLoader, build_transform, open_dataset
from minidl.errors import UserError
from minidl.fileio import writable, write_json_atomic

GPU_RATE = 5000  # images/s one GPU consumes (the line on cores needed)
CLASSES = 10
TREE_VERSION = 1


def parse_args(argv):
    cores = os.cpu_count() or 1
    p = argparse.ArgumentParser(prog="python -m minidl.bench loader", description=__doc__.split("\n\n")[0])
    p.add_argument("--data-path", type=Path, help="ImageNet-layout folder (default: generate one)")
    p.add_argument("--shards", type=Path, help="its HDF5 shards (made by data/prepare_imagenet.py); "
                   "made automatically for the generated tree")
    p.add_argument("--generate", type=int, default=2000, metavar="N",
                   help="training JPEGs to generate when no --data-path is given")
    p.add_argument("--cache-dir", type=Path, default=Path(cache_dir()))
    p.add_argument("--workers", default=",".join(str(w) for w in range(1, cores + 1)),
                   help="comma-separated worker counts")
    p.add_argument("--images", type=int, default=2000, help="images timed per run (at most an epoch)")
    p.add_argument("--repeat", type=int, default=3, help="runs per row; the table shows the median")
    p.add_argument("-b", "--batch-size", type=int, default=32)
    p.add_argument("--size", type=int, default=224, help="crop size")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    args = p.parse_args(argv)
    if args.data_path is None:  # the generated tree and its shards go there
        writable("--cache-dir", args.cache_dir, folder=True)
    try:
        args.workers = [int(w) for w in args.workers.split(",")]
    except ValueError:
        raise UserError(f"--workers {args.workers!r} is not a comma-separated list of counts, "
                        "e.g. 1,2,4") from None
    return args


# --- data ------------------------------------------------------------------------------------

def draw_photo(rng, width=500, height=375):
    """A photo-like image: a smooth colour field, texture and sensor noise; ~110 KB at q90."""
    def field(rows, cols):
        cells = Image.fromarray(rng.integers(0, 256, (rows, cols, 3), np.uint8))
        return np.asarray(cells.resize((width, height), Image.Resampling.BICUBIC), np.float32)
    pixels = 0.6 * field(6, 8) + 0.4 * field(height // 2, width // 2)
    pixels += rng.normal(0, 8, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _write_photo(job):
    path, key = job
    rng = np.random.default_rng(key)
    width, height = int(rng.integers(470, 501)), int(rng.integers(350, 376))
    draw_photo(rng, width, height).save(path, "JPEG", quality=90)


def generate_tree(root, images):
    """`images` training JPEGs (and 2 per class for val/) in CLASSES folders under `root`.

    Cached: a manifest, written last, marks a complete tree made with the same parameters.
    """
    manifest = {"version": TREE_VERSION, "images": images}
    try:
        if json.loads((root / "manifest.json").read_text()) == manifest:
            return root
    except (OSError, ValueError):
        pass
    jobs = []
    for split_id, (split, count) in enumerate((("train", images), ("val", 2 * CLASSES))):
        for i in range(count):
            folder = root / split / f"class{i % CLASSES:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            jobs.append((folder / f"{i:06d}.JPEG", [split_id, i]))
    print(f"generating {len(jobs)} JPEGs in {root} ...", flush=True)
    with ProcessPoolExecutor() as pool:
        list(pool.map(_write_photo, jobs, chunksize=32))
    write_json_atomic(root / "manifest.json", manifest)
    return root


def pack(folder, shards):
    """Make (or resume, or verify) the shards of `folder` with data/prepare_imagenet.py."""
    script = Path(minidl.__file__).resolve().parents[1] / "data" / "prepare_imagenet.py"
    if not script.is_file():
        return f"not measured: {script} is missing (run from a source checkout, or give --shards)"
    subprocess.run([sys.executable, str(script), str(folder), str(shards)], check=True,
                   stdout=sys.stderr)  # stdout is the report's
    return None


def describe(dataset, count=50):
    """Mean width x height and file size of `count` training images spread over the set."""
    paths = [dataset.path(i) for i in np.linspace(0, len(dataset) - 1, count).astype(int)]
    sizes = [Image.open(p).size for p in paths]
    return (f"mean {np.mean([w for w, _ in sizes]):.0f}x{np.mean([h for _, h in sizes]):.0f}, "
            f"{np.mean([p.stat().st_size for p in paths]) / 1e3:.0f} KB")


# --- timing ----------------------------------------------------------------------------------

def _cpu_seconds():
    """CPU time of this process and of its children that have been waited for."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def rate(batches, limit):
    """(images/s after the first batch, CPU seconds per image of all processes), up to
    `limit` images. CPU time barely depends on what else the machine runs; wall time does."""
    cpu = _cpu_seconds()
    iterator = iter(batches)
    first = count = len(next(iterator)[0])
    start = time.perf_counter()
    for images, _ in iterator:
        count += len(images)
        if count >= limit:
            break
    seconds = time.perf_counter() - start
    del iterator  # stops and reaps the workers (both loaders do that when dropped)
    return (count - first) / seconds, (_cpu_seconds() - cpu) / count


def minidl_rate(dataset, workers, args):
    loader = DataLoader(dataset, args.batch_size, build_transform("imagenet", args.size),
                        shuffle=True, workers=workers)
    return rate(loader, args.images)


def torchvision_rate(folder, workers, args):
    import torch
    from torchvision import datasets, transforms
    transform = transforms.Compose([transforms.RandomResizedCrop(args.size),
                                    transforms.RandomHorizontalFlip(), transforms.PILToTensor()])
    loader = torch.utils.data.DataLoader(datasets.ImageFolder(folder / "train", transform),
                                         batch_size=args.batch_size, shuffle=True,
                                         num_workers=workers)
    return rate(loader, args.images)


def torchvision_missing():
    try:
        import torchvision  # noqa: F401
    except Exception as e:  # ImportError, or a torchvision that does not match torch
        return f"not measured: torchvision does not import here ({type(e).__name__}: {e})"
    return None


# --- report ----------------------------------------------------------------------------------

def measure(args):
    """The benchmark's results: one row per (workers, source), and why anything was left out."""
    folder, shards = args.data_path, args.shards
    if folder is None:
        folder = generate_tree(args.cache_dir / f"bench-loader-{args.generate}", args.generate)
        shards = shards or folder.with_name(folder.name + "-shards")
        shards_note = pack(folder, shards)
    else:
        shards_note = None if shards else "not measured: give --shards (data/prepare_imagenet.py)"
    tv_note = torchvision_missing()
    folder_set = open_dataset(folder, "train")
    runs = {"JPEG folder": lambda w: minidl_rate(folder_set, w, args)}
    if shards_note is None:
        shard_set = open_dataset(shards, "train")
        runs["HDF5 shards"] = lambda w: minidl_rate(shard_set, w, args)
    if tv_note is None:
        runs["torchvision"] = lambda w: torchvision_rate(folder, w, args)
    measured = collections.defaultdict(list)
    for _ in range(args.repeat):  # interleaved, so that a slow spell hits every run alike
        for workers in args.workers:
            for name, run in runs.items():
                measured[name, workers].append(run(workers))
    rows = []
    for (name, workers), samples in sorted(measured.items(), key=lambda item: item[0][1]):
        images_per_sec, cpu_per_image = (statistics.median(column) for column in zip(*samples))
        rows.append({"source": name, "workers": workers, "images_per_sec": images_per_sec,
                     "per_worker": images_per_sec / workers,
                     "cpu_ms_per_image": 1e3 * cpu_per_image,
                     "cores_for_gpu": GPU_RATE * cpu_per_image,
                     "runs_images_per_sec": [per_sec for per_sec, _ in samples]})
    for row in rows:
        tv = [r for r in rows if r["source"] == "torchvision" and r["workers"] == row["workers"]]
        row["vs_torchvision"] = row["images_per_sec"] / tv[0]["images_per_sec"] if tv else None
    return {"folder": str(folder), "images": describe(folder_set), "shards": shards and str(shards),
            "batch_size": args.batch_size, "size": args.size, "timed_images": args.images,
            "repeat": args.repeat, "cpu_count": os.cpu_count(), "rows": rows,
            "gpu_images_per_sec": GPU_RATE,
            "notes": {"HDF5 shards": shards_note, "torchvision": tv_note}}


def print_table(result):
    print(f"loader benchmark: decode + random-resized-crop {result['size']} + flip, batch "
          f"{result['batch_size']}, median of {result['repeat']} runs of "
          f"{result['timed_images']} images, {result['cpu_count']} cores; {result['folder']} "
          f"({result['images']})")
    header = (f"{'source':<12} {'workers':>7} {'img/s':>7} {'img/s/worker':>12} "
              f"{'vs torchvision':>14} {'CPU ms/img':>10} {'cores for 5k/s':>14}")
    print(header + "\n" + "-" * len(header))
    for r in result["rows"]:
        ratio = f"{r['vs_torchvision']:.2f}x" if r["vs_torchvision"] else "-"
        print(f"{r['source']:<12} {r['workers']:>7} {r['images_per_sec']:7.0f} "
              f"{r['per_worker']:12.0f} {ratio:>14} {r['cpu_ms_per_image']:10.2f} "
              f"{r['cores_for_gpu']:14.1f}")
    for what, note in result["notes"].items():
        if note:
            print(f"{what}: {note}")
    for source in ("JPEG folder", "HDF5 shards"):
        rows = [r for r in result["rows"] if r["source"] == source]
        if rows:
            need = min(r["cores_for_gpu"] for r in rows)
            print(f"one GPU consuming {GPU_RATE:,} img/s needs {math.ceil(need)} cores "
                  f"({source}: {1e3 * need / GPU_RATE:.2f} CPU ms per image, workers and "
                  "consumer)")


def main(argv):
    args = parse_args(argv)
    result = measure(args)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0
