"""Tests of the sampler and the loader: coverage across ranks, determinism across workers and
ranks, undecodable images, the GPU copy protocol, and that no worker process outlives a loader."""

import collections
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from PIL import Image

from minidl.data import (BadImageWarning, DataLoader, DistributedSampler, FolderDataset,
                         build_transform, build_val_transform)
from minidl.data import device
from minidl.data.images import ImageDataset
from test_data import label_of, make_tree


# --- the sampler ---

@pytest.mark.parametrize("size", [12, 13, 15])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_sampler_every_index_once_per_epoch_across_ranks(size, world_size):
    for drop_last in (False, True):
        ranks = [DistributedSampler(size, r, world_size, seed=5, drop_last=drop_last)
                 for r in range(world_size)]
        for epoch in (0, 1):
            for sampler in ranks:
                sampler.set_epoch(epoch)
            parts = [list(s) for s in ranks]
            assert len({len(p) for p in parts}) == 1 and len(parts[0]) == len(ranks[0])
            counts = collections.Counter(i for p in parts for i in p)
            tail = size % world_size
            if drop_last:  # the last `tail` of the epoch's order are not read; none twice
                assert len(counts) == size - tail and set(counts.values()) == {1}
            else:  # all read; the padding repeats `pad` of them
                pad = (world_size - tail) % world_size
                assert set(counts) == set(range(size))
                assert sorted(counts.values()) == [1] * (size - pad) + [2] * pad
        # Another epoch, another order.
        ranks[0].set_epoch(0)
        first = list(ranks[0])
        ranks[0].set_epoch(1)
        assert list(ranks[0]) != first


def test_sampler_without_shuffle_deals_in_order():
    def dealt(**kwargs):
        samplers = [DistributedSampler(7, r, 3, shuffle=False, **kwargs) for r in range(3)]
        assert [len(s) for s in samplers] == [len(list(s)) for s in samplers]
        return [list(s) for s in samplers]
    assert dealt() == [[0, 3, 6], [1, 4, 0], [2, 5, 1]]
    assert dealt(drop_last=True) == [[0, 3], [1, 4], [2, 5]]
    assert dealt(pad=False) == [[0, 3, 6], [1, 4], [2, 5]]  # for evaluation: each once


# --- determinism ---

class Indexed(ImageDataset):
    """Image i is 6x6 noise keyed by i, label i: every crop is traceable to its sample."""

    def __init__(self, size=40):
        self.classes, self.labels = [str(i) for i in range(size)], np.arange(size)

    def read(self, i):
        buffer = io.BytesIO()
        pixels = np.random.default_rng(i).integers(0, 256, (6, 6, 3), np.uint8)
        Image.fromarray(pixels).save(buffer, "PNG")
        return buffer.getvalue()

    def source(self, i):
        return f"sample {i}"


def _samples(loaders, epoch):
    """{label: image} over every batch of every loader (one per rank) for `epoch`."""
    seen = {}
    for loader in loaders:
        loader.set_epoch(epoch)
        for images, labels in loader:
            for image, label in zip(images, labels):
                seen.setdefault(int(label), image)
                assert np.array_equal(seen[int(label)], image)  # a padded repeat: same crop
    return seen


def test_augmentation_is_the_same_for_any_workers_and_ranks():
    dataset, transform = Indexed(), build_transform("imagenet", 4)
    reference = None
    for workers, world_size in ((0, 1), (2, 1), (1, 3), (2, 3)):
        loaders = [DataLoader(dataset, 5, transform, seed=7, workers=workers,
                              sampler=DistributedSampler(len(dataset), r, world_size, seed=7))
                   for r in range(world_size)]
        seen = _samples(loaders, epoch=2)
        assert sorted(seen) == list(range(len(dataset)))
        reference = reference or seen
        assert all(np.array_equal(reference[i], seen[i]) for i in seen)
    # Another epoch augments differently.
    other = _samples([DataLoader(dataset, 5, transform, seed=7, shuffle=True)], epoch=3)
    assert sum(np.array_equal(reference[i], other[i]) for i in other) < len(other) // 2
    assert multiprocessing.active_children() == []


# --- undecodable images ---

@pytest.fixture
def damaged_tree(tmp_path):
    """A JPEG tree of 3 classes x 4 images where train/b/1 is garbage and train/c/2 truncated."""
    root = make_tree(tmp_path, {"train": {"a": 4, "b": 4, "c": 4}, "val": {"a": 1, "b": 1, "c": 1}},
                     size=(40, 30), ext="JPEG")
    (root / "train/b/1.JPEG").write_bytes(b"\xff\xd8 not really a JPEG")
    whole = (root / "train/c/2.JPEG").read_bytes()
    (root / "train/c/2.JPEG").write_bytes(whole[:len(whole) // 2])
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_undecodable_images_are_skipped_warned_counted_labels_aligned(damaged_tree, workers):
    dataset = FolderDataset(damaged_tree, "train")
    loader = DataLoader(dataset, 4, build_val_transform(16, 16), workers=workers)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        with pytest.warns(BadImageWarning) as caught:
            batches = list(loader)
        assert loader.skipped == 2
        assert [len(labels) for _, labels in batches] == [4, 3, 3]  # never dropped, only smaller
        for images, labels in batches:
            assert np.array_equal(label_of(images), labels)
        messages = " ".join(str(w.message) for w in caught)
        for name in ("b/1.JPEG", "c/2.JPEG"):
            assert str(damaged_tree / "train" / name) in messages
    assert multiprocessing.active_children() == []


def test_a_batch_of_only_undecodable_images_comes_out_empty(damaged_tree):
    class Fixed(DistributedSampler):  # b/1 and c/2 (both bad), then a/0
        def indices(self):
            return np.array([5, 10, 0])

    dataset = FolderDataset(damaged_tree, "train")
    loader = DataLoader(dataset, 2, build_val_transform(16, 16), sampler=Fixed(3))
    with pytest.warns(BadImageWarning):
        (empty, no_labels), (last, labels) = list(loader)
    assert empty.shape == (0, 16, 16, 3) and no_labels.shape == (0,)
    assert labels.tolist() == [0] and loader.skipped == 2


# --- the GPU copy protocol, with a stand-in for CuPy ---

class LateCopier:
    """Behaves like device.DeviceCopier, but copies only when waited for: the latest moment a
    real asynchronous copy may read its source. A slot reused too early shows as wrong pixels."""

    instances = []

    def __init__(self, host):
        self.host, self.closed = host, False
        LateCopier.instances.append(self)

    def start(self, images):
        return None, images  # the "event" is the source itself

    def wait(self, source):
        self.last = source.copy()

    def close(self):
        self.closed = True


def test_device_batches_keep_slots_until_copied(monkeypatch):
    """Each batch's slot stays untouched until the copier is done with it."""
    monkeypatch.setattr(device, "DeviceCopier", LateCopier)
    dataset, transform = Indexed(), build_transform("imagenet", 4)
    for workers in (0, 2):
        host = list(DataLoader(dataset, 3, transform, seed=1, shuffle=True, workers=workers))
        loader = DataLoader(dataset, 3, transform, seed=1, shuffle=True, workers=workers,
                            to_device=True)
        copier_count = len(LateCopier.instances)
        arrived = []
        for _, labels in loader:
            arrived.append((LateCopier.instances[-1].last, labels))
        assert len(LateCopier.instances) == copier_count + 1 and LateCopier.instances[-1].closed
        assert len(arrived) == len(host)
        for (images, labels), (expected, expected_labels) in zip(arrived, host):
            assert np.array_equal(images, expected) and np.array_equal(labels, expected_labels)


# --- shutdown ---

class Slow(Indexed):
    def read(self, i):
        time.sleep(0.05)
        return super().read(i)


class Failing(Indexed):
    def read(self, i):
        if i == 30:
            raise ValueError("sample 30 is broken")
        return super().read(i)


def test_no_worker_left_after_close_break_or_worker_error():
    transform = build_transform("none", 6)
    loader = DataLoader(Slow(), 2, transform, workers=2)
    batches = iter(loader)
    next(batches)
    assert len(multiprocessing.active_children()) == 2
    loader.close()  # while the iteration is suspended
    assert multiprocessing.active_children() == []
    for _ in DataLoader(Slow(), 2, transform, workers=2):
        break
    assert multiprocessing.active_children() == []
    with pytest.raises(ValueError, match="sample 30 is broken") as error:
        list(DataLoader(Failing(), 4, transform, workers=2))
    assert "Traceback" in str(error.value.__cause__)  # the worker's own traceback
    assert multiprocessing.active_children() == []


def test_a_worker_killed_by_a_signal_is_an_error_not_a_hang():
    loader = DataLoader(Slow(), 2, build_transform("none", 6), workers=2)
    batches = iter(loader)
    next(batches)
    os.kill(multiprocessing.active_children()[0].pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="was killed by SIGKILL"):
        for _ in batches:
            pass
    assert multiprocessing.active_children() == []


_CHILD = textwrap.dedent("""
    import multiprocessing, signal, sys, time
    # Ctrl-C raises KeyboardInterrupt, as in a terminal, also where the test runner was started
    # in the background by a shell (which ignores SIGINT there, and children inherit that)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    from minidl.data import DataLoader, build_transform
    from test_data_loader import Slow
    loader = DataLoader(Slow(), 2, build_transform("none", 6), workers=2)
    try:
        for n, _ in enumerate(loader):
            if n == 0:
                print(*[p.pid for p in multiprocessing.active_children()], flush=True)
            time.sleep({step_seconds})  # the training step
    except KeyboardInterrupt:
        print("interrupted", len(multiprocessing.active_children()), flush=True)
""")


def _gone(pid, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("how", ["ctrl-c waiting for a batch", "ctrl-c in a step", "parent-killed"])
@pytest.mark.slow
def test_workers_stop_on_ctrl_c_and_when_the_parent_dies(how):
    """Ctrl-C: SIGINT to the whole process group, as a terminal sends it, while the loader
    waits for a batch or while the training step runs. Parent killed: SIGKILL to the parent
    alone; its workers notice and exit by themselves."""
    script = _CHILD.format(tests=os.path.dirname(__file__),
                           step_seconds=10 if how == "ctrl-c in a step" else 0)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    workers = [int(pid) for pid in child.stdout.readline().split()]
    assert len(workers) == 2
    if how.startswith("ctrl-c"):
        os.killpg(child.pid, signal.SIGINT)
        assert child.stdout.readline().split() == ["interrupted", "0"]
    else:
        child.kill()
    child.wait(timeout=10)
    assert all(_gone(pid) for pid in workers)
