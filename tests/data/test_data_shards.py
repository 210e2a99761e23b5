"""Tests of HDF5 shards: data/prepare_imagenet.py (layouts, errors, resuming after a kill) and
HDF5Dataset (the same samples and batches as the image folder it was made from)."""

import hashlib
import importlib.util
import io
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from minidl.data import (BadImageWarning, DataLoader, DistributedSampler, FolderDataset,
                         HDF5Dataset, build_transform, open_dataset)
from minidl.errors import UserError
from test_data import label_of, make_tree

SCRIPT = Path(__file__).resolve().parents[2] / "data" / "prepare_imagenet.py"
_spec = importlib.util.spec_from_file_location("prepare_imagenet", SCRIPT)
prepare_imagenet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(prepare_imagenet)

LAYOUT = {"train": {"n02": 5, "n01": 4, "n03": 3}, "val": {"n01": 2, "n02": 2, "n03": 2}}


def prepare(*args):
    return prepare_imagenet.main([str(a) for a in args])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """(source tree of JPEGs and one PNG, its shards in JPEG bytes as they are)."""
    src = make_tree(tmp_path_factory.mktemp("src"), LAYOUT, size=(40, 30), ext="JPEG")
    Image.new("RGB", (30, 40), (60, 0, 0)).save(src / "train/n02/5.png")
    dst = tmp_path_factory.mktemp("shards")
    assert prepare(src, dst, "--shard-size", 4, "--workers", 2) == 0
    return src, dst


def _sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_shards_hold_the_folder_bytes_labels_and_checksums(prepared):
    src, dst = prepared
    index = json.loads((dst / "index.json").read_text())
    assert index["classes"] == ["n01", "n02", "n03"]
    assert index["splits"]["train"]["class_counts"] == [4, 6, 3]
    for split, count in (("train", 13), ("val", 6)):
        shards = index["splits"][split]["shards"]
        assert [s["images"] for s in shards] == [4] * (count // 4) + [count % 4] * (count % 4 > 0)
        for shard in shards:
            assert _sha256(dst / shard["file"]) == shard["sha256"]
        folder, sharded = open_dataset(src, split), open_dataset(dst, split)
        assert isinstance(sharded, HDF5Dataset) and isinstance(folder, FolderDataset)
        assert len(sharded) == count and np.array_equal(sharded.labels, folder.labels)
        for i in range(count):
            assert sharded.read(i) == folder.path(i).read_bytes()
            assert folder.path(i).relative_to(src).as_posix() in sharded.source(i)


def test_folder_and_shards_give_identical_batches(prepared):
    src, dst = prepared
    transform = build_transform("imagenet", 12)
    for workers in (0, 2):
        for rank in range(2):
            batches = []
            for path in (src, dst):
                dataset = open_dataset(path, "train")
                loader = DataLoader(dataset, 3, transform, seed=4, workers=workers,
                                    sampler=DistributedSampler(len(dataset), rank, 2, seed=4))
                loader.set_epoch(1)
                batches.append(list(loader))
            assert len(batches[0]) == len(batches[1]) == 3
            for (xa, ya), (xb, yb) in zip(*batches):
                assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
                assert np.array_equal(label_of(xa), ya)
    assert multiprocessing.active_children() == []


def test_a_truncated_missing_or_foreign_shard_is_reported_with_its_path(prepared, tmp_path):
    dst = tmp_path / "shards"
    shutil.copytree(prepared[1], dst)
    shard = dst / "train-00001.h5"
    shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])
    for breakage in ("truncated", "missing", "foreign"):
        if breakage == "missing":
            shard.unlink()
        if breakage == "foreign":
            (dst / "index.json").write_text('{"format": "something else"}')
        with pytest.raises(UserError) as error:
            open_dataset(dst, "train")
        text = str(error.value)
        assert "\n" not in text
        assert str(shard if breakage != "foreign" else dst / "index.json") in text
    assert open_dataset(prepared[1], "val")  # val shards are fine


@pytest.mark.slow
def test_prepare_resumes_after_being_killed_midway(tmp_path):
    src = make_tree(tmp_path / "src", {"train": {"a": 30, "b": 30}, "val": {"a": 2, "b": 2}},
                    size=(200, 150), ext="JPEG")
    dst = tmp_path / "dst"
    args = [src, dst, "--resize", 64, "--shard-size", 2, "--workers", 1]
    child = subprocess.Popen([sys.executable, str(SCRIPT), *map(str, args)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    deadline = time.monotonic() + 60
    while not list(dst.glob("*.h5.json")) and time.monotonic() < deadline:
        time.sleep(0.002)
    os.killpg(child.pid, signal.SIGKILL)  # the tool and its pool, as a crash would
    child.wait()
    finished = {p.name: os.stat(p) for p in dst.glob("*.h5") if (dst / f"{p.name}.json").exists()}
    assert 0 < len(finished) < 32 and not (dst / "index.json").exists()

    assert prepare(*args) == 0
    index = json.loads((dst / "index.json").read_text())
    shards = [s for split in index["splits"].values() for s in split["shards"]]
    assert len(shards) == 32 and not [p for p in os.listdir(dst) if ".tmp-" in p]
    for name, before in finished.items():  # kept, not rewritten
        after = os.stat(dst / name)
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    for shard in shards:
        assert _sha256(dst / shard["file"]) == shard["sha256"]
    dataset = open_dataset(dst, "train")
    assert np.array_equal(dataset.labels, FolderDataset(src, "train").labels)
    assert min(Image.open(io.BytesIO(dataset.read(7))).size) == 64

    # A finished shard that no longer matches its checksum is made again.
    damaged = dst / shards[0]["file"]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    assert prepare(*args) == 0
    assert _sha256(damaged) == shards[0]["sha256"]


def test_prepare_reads_a_flat_val_folder_with_a_labels_file(tmp_path):
    src = make_tree(tmp_path / "src", {"train": {"n01": 1, "n02": 1}}, ext="JPEG")
    (src / "val").mkdir()
    for k, wnid in enumerate(["n02", "n01", "n02"]):
        shutil.copy(src / "train" / wnid / "0.JPEG", src / "val" / f"ILSVRC2012_val_{k:08d}.JPEG")
    csv = src / "LOC_val_solution.csv"  # ImageNet's format: the first box's wnid is the label
    csv.write_text("ImageId,PredictionString\n" + "".join(
        f"ILSVRC2012_val_{k:08d},{wnid} 1 2 3 4 {wnid} 5 6 7 8\n"
        for k, wnid in ((2, "n02"), (0, "n02"), (1, "n01"))))
    assert prepare(src, tmp_path / "dst", "--val-labels", csv) == 0
    val = open_dataset(tmp_path / "dst", "val")
    assert val.labels.tolist() == [1, 0, 1]
    assert all(val.read(i) == (src / "train" / ["n01", "n02"][label] / "0.JPEG").read_bytes()
               for i, label in enumerate(val.labels))


def _flat_val_tree(root, labels=None):
    make_tree(root, {"train": {"a": 1}}, ext="JPEG")
    (root / "val").mkdir()
    shutil.copy(root / "train/a/0.JPEG", root / "val/x.JPEG")
    if labels is not None:
        (root / "labels.txt").write_text(labels)
    return root


@pytest.mark.parametrize("case, message", [
    ("missing source", "does not exist"),
    ("empty class", "holds no .jpeg/.jpg/.png images"),
    ("other classes", "different class folders"),
    ("flat val, no labels", "give their labels with --val-labels"),
    ("unknown wnid", "names no class of train/"),
    ("unlabelled image", "x.JPEG has no label"),
    ("bad flag", "--shard-size must be a positive integer"),
])
def test_prepare_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, case, message):
    src, extra = tmp_path / "src", []
    if case == "empty class":
        make_tree(src, {"train": {"a": 1, "b": 0}, "val": {"a": 1, "b": 1}})
    elif case == "other classes":
        make_tree(src, {"train": {"a": 1}, "val": {"b": 1}})
    elif case == "flat val, no labels":
        _flat_val_tree(src)
    elif case in ("unknown wnid", "unlabelled image"):
        _flat_val_tree(src, "x.JPEG zz\n" if case == "unknown wnid" else "y.JPEG a\n")
        extra = ["--val-labels", src / "labels.txt"]
    elif case == "bad flag":
        make_tree(src, {"train": {"a": 1}, "val": {"a": 1}})
        extra = ["--shard-size", "0"]
    assert prepare(src, tmp_path / "dst", *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("prepare_imagenet.py: error: ") and err.count("\n") == 1
    assert message in err


def test_undecodable_source_images_are_stored_and_skipped_by_the_loader(tmp_path, capsys):
    src = make_tree(tmp_path / "src", {"train": {"a": 2, "b": 2}, "val": {"a": 1, "b": 1}},
                    size=(40, 30), ext="JPEG")
    (src / "train/b/1.JPEG").write_bytes(b"\xff\xd8 broken")
    assert prepare(src, tmp_path / "dst", "--resize", 16) == 0
    assert "1 images do not decode" in capsys.readouterr().out
    dataset = open_dataset(tmp_path / "dst", "train")
    assert [min(Image.open(io.BytesIO(dataset.read(i))).size) for i in (0, 1, 2)] == [16] * 3
    loader = DataLoader(dataset, 4, build_transform("none", 8))
    with pytest.warns(BadImageWarning, match=r"train/b/1\.JPEG \(image 3 of shard .*train-00000\.h5"):
        (images, labels), = list(loader)
    assert labels.tolist() == [0, 0, 1] and loader.skipped == 1
