"""Tests of minidl.data: the embedded dataset, image folders, transforms and the loader."""

import filecmp
import multiprocessing

import numpy as np
import pytest
from PIL import Image

from minidl.data import (EMBEDDED_CLASSES, BadImage, DataLoader, FolderDataset, build_transform,
                         build_val_transform, check_folder_layout, make_embedded_dataset,
                         normalize)
from minidl.data import embedded
from minidl.data.transforms import RandomResizedCrop
from minidl.errors import UserError

SMALL = {"train_per_class": 12, "val_per_class": 4}


@pytest.fixture(scope="module")
def small_root(tmp_path_factory):
    return make_embedded_dataset(tmp_path_factory.mktemp("embedded") / "data", **SMALL)


def _files(root):
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


# --- the embedded dataset ---

def test_embedded_layout_and_counts(small_root):
    for split, count in (("train", 12), ("val", 4)):
        assert sorted(p.name for p in (small_root / split).iterdir()) == sorted(EMBEDDED_CLASSES)
        for name in EMBEDDED_CLASSES:
            images = list((small_root / split / name).glob("*.png"))
            assert len(images) == count
    with Image.open(images[0]) as image:
        assert image.mode == "RGB" and image.size == (32, 32)
    # Nothing is left beside the dataset: the temporary folder was renamed into place.
    assert [p.name for p in small_root.parent.iterdir()] == [small_root.name]


def test_embedded_same_seed_same_bytes_other_seed_differs(small_root, tmp_path):
    again = make_embedded_dataset(tmp_path / "again", **SMALL)
    files = _files(small_root)
    assert files == _files(again)
    _, mismatch, errors = filecmp.cmpfiles(small_root, again, files, shallow=False)
    assert mismatch == [] and errors == []
    other = make_embedded_dataset(tmp_path / "other", seed=1, **SMALL)
    _, mismatch, _ = filecmp.cmpfiles(small_root, other, files, shallow=False)
    assert len(mismatch) > len(files) // 2


def test_embedded_label_noise_files_an_exact_fraction_of_the_same_images_under_other_classes(small_root, tmp_path):
    noisy = make_embedded_dataset(tmp_path / "noisy", label_noise=0.25, **SMALL)  # 3 of each class's 12
    moved = [path for path in _files(noisy) if "-from-" in path.name]
    assert len(moved) == 3 * len(EMBEDDED_CLASSES) and all(path.parts[0] == "train" for path in moved)
    for path in moved:
        index, source = path.stem.split("-from-")
        assert source != path.parts[1]  # filed under another class, never its own
        assert (noisy / path).read_bytes() == (small_root / "train" / source / f"{index}.png").read_bytes()
    for name in EMBEDDED_CLASSES:
        kept = [p for p in (noisy / "train" / name).glob("*.png") if "-from-" not in p.name]
        assert len(kept) == 9
    clean = [path for path in _files(noisy) if "-from-" not in path.name and path.name != embedded.MANIFEST]
    _, mismatch, errors = filecmp.cmpfiles(small_root, noisy, clean, shallow=False)
    assert mismatch == [] and errors == []  # the kept images and the whole validation set as without noise
    with pytest.raises(ValueError, match="not a fraction"):
        make_embedded_dataset(tmp_path / "bad", label_noise=1.0, **SMALL)


def test_embedded_cache_hit_and_regeneration(tmp_path, monkeypatch):
    root = make_embedded_dataset(tmp_path / "data", train_per_class=2, val_per_class=1)
    calls = []
    monkeypatch.setattr(embedded, "_write_tree", lambda *args: calls.append(args))
    assert make_embedded_dataset(root, train_per_class=2, val_per_class=1) == root
    assert calls == []
    monkeypatch.undo()
    # Other parameters replace the old dataset.
    make_embedded_dataset(root, train_per_class=3, val_per_class=1)
    assert len(list((root / "train" / "disk").iterdir())) == 3
    assert [p.name for p in tmp_path.iterdir()] == ["data"]


def test_embedded_interrupted_generation_leaves_nothing(tmp_path, monkeypatch):
    def fail(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(embedded, "_write_json", fail)
    with pytest.raises(KeyboardInterrupt):
        make_embedded_dataset(tmp_path / "data", train_per_class=1, val_per_class=1)
    assert list(tmp_path.iterdir()) == []


def test_embedded_refuses_a_foreign_folder(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(UserError, match="not an embedded dataset"):
        make_embedded_dataset(tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def _colour_features(root, split):
    dataset = FolderDataset(root, split)
    features = []
    for i in range(len(dataset)):
        pixels = np.asarray(Image.open(dataset.path(i)), dtype=np.float64).reshape(-1, 3)
        features.append(np.concatenate([pixels.mean(0), pixels.std(0)]))
    return np.array(features), dataset.labels


def test_embedded_not_separable_by_colour(tmp_path):
    """Logistic regression on per-image mean and std RGB stays near chance (0.1)."""
    root = make_embedded_dataset(tmp_path / "data", train_per_class=150, val_per_class=50)
    x_train, y_train = _colour_features(root, "train")
    x_val, y_val = _colour_features(root, "val")
    mean, std = x_train.mean(0), x_train.std(0)
    x_train, x_val = ((np.c_[x, np.ones(len(x))] - np.r_[mean, 0]) / np.r_[std, 1]
                      for x in (x_train, x_val))
    weights = np.zeros((x_train.shape[1], len(EMBEDDED_CLASSES)))
    targets = np.eye(len(EMBEDDED_CLASSES))[y_train]
    for _ in range(500):
        logits = x_train @ weights
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        weights -= 0.5 * x_train.T @ (p - targets) / len(x_train)
    accuracy = np.mean((x_val @ weights).argmax(1) == y_val)
    assert accuracy < 0.3


# --- image folders ---

def make_tree(root, layout, size=(5, 4), ext="png"):
    """Make root/<split>/<class>/<i>.<ext> images for the {split: {class: count}} layout.

    Each image is one solid colour: red 20 + 40 * (the class's sorted position), green 10 * i,
    so that the label of any crop of it can be read back from its pixels (`label_of`).
    """
    for split, classes in layout.items():
        for name, count in classes.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            colour = 20 + 40 * sorted(classes).index(name)
            for i in range(count):
                Image.new("RGB", size, (colour, 10 * i % 256, 0)).save(folder / f"{i}.{ext}")
    return root


def label_of(images):
    """The labels that make_tree's colours encode, for a uint8 batch (B, H, W, 3)."""
    red = images[..., 0].reshape(len(images), -1).mean(axis=1)
    return np.rint((red - 20) / 40).astype(np.int64)


def test_folder_dataset_reads_classes_and_samples(tmp_path):
    root = make_tree(tmp_path, {"train": {"b": 2, "a": 1}, "val": {"a": 1, "b": 1}})
    (root / "train" / "b" / "X.JPEG").write_bytes((root / "train" / "b" / "0.png").read_bytes())
    (root / "train" / "b" / "notes.txt").write_text("not an image")
    (root / "train" / ".hidden").mkdir()
    dataset = FolderDataset(root, "train")
    assert dataset.classes == ["a", "b"]
    assert [(dataset.path(i).name, dataset.labels[i]) for i in range(len(dataset))] == [
        ("0.png", 0), ("0.png", 1), ("1.png", 1), ("X.JPEG", 1)]
    assert dataset.path(3) == root / "train" / "b" / "X.JPEG"
    image, label = dataset[2]
    assert (image.mode, image.size, label) == ("RGB", (5, 4), 1)
    assert len(dataset) == 4


@pytest.mark.parametrize("layout, message", [
    (None, "does not exist"),
    ({"train": {"a": 1}}, "has no val/ folder"),
    ({"val": {"a": 1}}, "has no train/ folder"),
    ({"train": {}, "val": {"a": 1}}, "has no class folders"),
    ({"train": {"a": 1, "b": 0}, "val": {"a": 1, "b": 1}}, "holds no .jpeg/.jpg/.png images"),
    ({"train": {"a": 1, "b": 1}, "val": {"a": 1, "c": 1}}, "different class folders"),
])
def test_folder_layout_errors(tmp_path, layout, message):
    root = tmp_path / "data"
    if layout is not None:
        make_tree(root, layout)
        for split in layout:
            (root / split).mkdir(exist_ok=True)
    for check in (check_folder_layout, lambda r: FolderDataset(r, "train")):
        with pytest.raises(UserError) as error:
            check(root)
        text = str(error.value)
        assert message in text and "\n" not in text and ": " in text


def test_folder_undecodable_image_is_a_bad_image(tmp_path):
    root = make_tree(tmp_path, {"train": {"a": 1}, "val": {"a": 1}})
    (root / "train" / "a" / "0.png").write_bytes(b"not a png")
    with pytest.raises(BadImage, match="not a JPEG or PNG image"):
        FolderDataset(root, "train")[0]


# --- transforms ---

@pytest.mark.parametrize("kind", ["imagenet", "cifar", "none"])
def test_train_transform_shape_dtype_determinism(kind):
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 40, 3), np.uint8))
    transform = build_transform(kind, 24)
    outputs = [transform(image, np.random.default_rng(seed)) for seed in (7, 7, 8, 9)]
    assert all(o.shape == (24, 24, 3) and o.dtype == np.uint8 for o in outputs)
    assert np.array_equal(outputs[0], outputs[1])
    if kind != "none":  # other seeds, other crops
        assert any(not np.array_equal(outputs[0], o) for o in outputs[2:])


def test_random_resized_crop_falls_back_to_a_centred_crop():
    """When 10 tries find no box (here: the area asked for exceeds the image's)."""
    crop = RandomResizedCrop(8, scale=(2.0, 3.0))
    assert crop._box(10, 40, np.random.default_rng(0)) == (0, 13, 10, 26)  # ratio 3/4
    assert crop._box(40, 10, np.random.default_rng(0)) == (13, 0, 26, 10)  # ratio 4/3
    assert crop._box(10, 10, np.random.default_rng(0)) == (0, 0, 10, 10)


def test_val_transform_resizes_short_side_and_crops_centre():
    pixels = np.random.default_rng(0).integers(0, 256, (30, 20, 3), np.uint8)
    out = build_val_transform(10, 8)(Image.fromarray(pixels))
    assert out.shape == (8, 8, 3) and out.dtype == np.uint8
    # An image already at the target size passes through untouched (no resampling).
    same = build_val_transform(20, 20)(Image.fromarray(pixels[5:25]))
    assert np.array_equal(same, pixels[5:25])


def test_cifar_transform_pads_with_zeros_and_keeps_pixels():
    pixels = np.full((8, 8, 3), 200, np.uint8)
    outputs = [build_transform("cifar", 8)(Image.fromarray(pixels), np.random.default_rng(s))
               for s in range(20)]
    assert {int(v) for o in outputs for v in np.unique(o)} == {0, 200}


def test_transform_errors_are_user_errors():
    with pytest.raises(UserError, match="unknown augmentation 'bogus'"):
        build_transform("bogus", 32)
    with pytest.raises(UserError, match="smaller than the crop size"):
        build_val_transform(200, 224)


def test_normalize():
    batch = np.array([[[[0, 128, 255]]]], np.uint8)
    out = normalize(batch, np, mean=(0, 128, 255), std=(1, 2, 5))
    assert out.dtype == np.float32 and out.shape == (1, 1, 1, 3)
    assert np.array_equal(out, np.zeros((1, 1, 1, 3), np.float32))
    assert np.allclose(normalize(np.full((1, 1, 1, 3), 10, np.uint8), np, (0, 0, 0), (2, 4, 5)),
                       [5, 2.5, 2])


# --- loader ---

def _epoch(loader, epoch):
    loader.set_epoch(epoch)
    return list(loader)


def test_loader_same_batches_with_and_without_workers(small_root):
    dataset = FolderDataset(small_root, "train")
    kwargs = dict(batch_size=16, transform=build_transform("imagenet", 24), shuffle=True,
                  seed=3)
    serial, parallel = (DataLoader(dataset, workers=w, **kwargs) for w in (0, 2))
    for epoch in (0, 1):
        a, b = _epoch(serial, epoch), _epoch(parallel, epoch)
        assert len(a) == len(b) == len(serial) == 8
        for (xa, ya), (xb, yb) in zip(a, b):
            assert xa.dtype == np.uint8 and ya.dtype == np.int64
            assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    assert a[-1][0].shape == (120 % 16, 24, 24, 3)
    assert multiprocessing.active_children() == []


def test_loader_every_sample_once_per_epoch():
    class Indices:  # a dataset whose label is the sample's own index
        def __len__(self):
            return 50

        def __getitem__(self, i):
            return Image.new("RGB", (2, 2)), i

    loader = DataLoader(Indices(), 8, build_transform("none", 2), shuffle=True, seed=0)
    orders = [np.concatenate([y for _, y in _epoch(loader, e)]) for e in (0, 1)]
    for order in orders:
        assert sorted(order) == list(range(50))
    assert not np.array_equal(orders[0], orders[1])
    loader.drop_last = True
    assert len(loader) == 6 and sum(len(y) for _, y in loader) == 48


class _Failing:
    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 30:
            raise UserError("image 30 is broken: replace it")
        return Image.new("RGB", (4, 4)), 0


def test_loader_leaves_no_processes(small_root):
    dataset = FolderDataset(small_root, "val")
    loader = DataLoader(dataset, 4, build_val_transform(32, 32), workers=2)
    for _ in loader:
        break
    assert multiprocessing.active_children() == []
    failing = DataLoader(_Failing(), 4, build_transform("none", 4), workers=2)
    with pytest.raises(UserError, match="image 30 is broken"):
        list(failing)
    assert multiprocessing.active_children() == []
