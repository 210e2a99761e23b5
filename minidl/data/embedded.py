"""The embedded dataset: ten procedurally drawn shape classes in the ImageNet folder layout.

It lets the whole stack train and be tested without downloading anything. Each image is one
shape of random size, position, rotation and colour on a random background colour with pixel
noise and distractor strokes. Colours are drawn independently of the class (with a minimum
luminance contrast between shape and background), so only the shape tells the classes apart.
Every image is drawn from its own generator, seeded by (seed, split, class, index): the same
seed gives byte-identical PNGs. `label_noise` moves an exact fraction of each class's training
images into other classes' folders (uniformly chosen, named `<index>-from-<class>.png`): noisy
labels for experiments; the images themselves and the validation set stay as without it.
"""

import json
import math
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from minidl.errors import UserError

EMBEDDED_CLASSES = ("arrow", "bar", "crescent", "disk", "plus", "ring", "square", "star",
                    "tee", "triangle")
TRAIN_PER_CLASS = 600
VAL_PER_CLASS = 100
IMAGE_SIZE = 32
MANIFEST = "manifest.json"
# Bump when the drawing changes, so cached datasets made by older code are regenerated.
GENERATOR_VERSION = 1

LABEL_NOISE_STREAM = 2  # the split id after train (0) and val (1): flips use their own generators
SUPERSAMPLE = 4  # drawn at 4x resolution, then box-filtered down: antialiased edges


@dataclass(frozen=True)
class Difficulty:
    """How hard the images are: contrast, noise and clutter, and the shape's size."""
    min_contrast: int       # minimum |luminance(shape) - luminance(background)|, 0-255 scale
    noise_sigma: tuple      # range of the per-image standard deviation of pixel noise, 0-255 scale
    distractors: tuple      # range of the number of distractors, inclusive
    shape_radius: tuple     # range of the shape's outer radius, as a fraction of the side


DIFFICULTIES = {
    "default": Difficulty(100, (2, 8), (1, 4), (0.28, 0.46)),
    # for experiments that need headroom: fainter, noisier, smaller shapes among more clutter
    "hard": Difficulty(40, (6, 20), (3, 8), (0.2, 0.42)),
}


def _star(points, inner):
    return [(math.cos(math.pi * k / points) * (1 if k % 2 == 0 else inner),
             math.sin(math.pi * k / points) * (1 if k % 2 == 0 else inner))
            for k in range(2 * points)]


# Polygon outlines in a unit frame (centred, fitting in the unit circle, pointing along +x).
_POLYGONS = {
    "arrow": [(-0.98, -0.17), (0.15, -0.17), (0.15, -0.55), (1, 0), (0.15, 0.55),
              (0.15, 0.17), (-0.98, 0.17)],
    "bar": [(-0.97, -0.24), (0.97, -0.24), (0.97, 0.24), (-0.97, 0.24)],
    "plus": [(-0.2, -0.95), (0.2, -0.95), (0.2, -0.2), (0.95, -0.2), (0.95, 0.2), (0.2, 0.2),
             (0.2, 0.95), (-0.2, 0.95), (-0.2, 0.2), (-0.95, 0.2), (-0.95, -0.2),
             (-0.2, -0.2)],
    "square": [(-0.7, -0.7), (0.7, -0.7), (0.7, 0.7), (-0.7, 0.7)],
    "star": _star(5, 0.42),
    "tee": [(-0.75, 0.3), (-0.19, 0.3), (-0.19, -0.95), (0.19, -0.95), (0.19, 0.3),
            (0.75, 0.3), (0.75, 0.65), (-0.75, 0.65)],
    "triangle": [(math.cos(a), math.sin(a)) for a in (0, 2 * math.pi / 3, 4 * math.pi / 3)],
}
# Round shapes as (radius, hole radius, hole offset along the rotation direction).
_ROUND = {"disk": (0.9, 0.0, 0.0), "ring": (0.95, 0.55, 0.0), "crescent": (0.95, 0.8, 0.45)}
assert set(_POLYGONS) | set(_ROUND) == set(EMBEDDED_CLASSES)


def _luminance(rgb):
    return 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]


def _colours(rng, min_contrast):
    """A background and a shape colour, uniform over RGB, at least `min_contrast` apart."""
    background = rng.integers(0, 256, 3)
    while True:  # rejection sampling, many candidates per round
        shapes = rng.integers(0, 256, (64, 3))
        ok = np.abs(_luminance(shapes) - _luminance(background)) >= min_contrast
        if ok.any():
            return tuple(background.tolist()), tuple(shapes[ok.argmax()].tolist())


def _draw_distractors(draw, rng, side, count):
    """A few thin strokes, scribbles and small dots: clutter that is none of the classes."""
    for _ in range(rng.integers(count[0], count[1] + 1)):
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        kind = rng.integers(3)
        if kind == 0:  # straight stroke
            xy = [tuple(p) for p in rng.uniform(0, side, (2, 2))]
            draw.line(xy, fill=colour, width=int(rng.integers(1, 3)) * SUPERSAMPLE)
        elif kind == 1:  # scribble: a short random walk
            start = rng.uniform(0, side, 2)
            steps = rng.normal(0, side / 8, (int(rng.integers(2, 5)), 2))
            xy = [tuple(p) for p in start + np.cumsum(np.vstack([[0, 0], steps]), axis=0)]
            draw.line(xy, fill=colour, width=SUPERSAMPLE, joint="curve")
        else:  # dot, far smaller than the smallest disk
            centre = rng.uniform(0, side, 2)
            r = rng.uniform(0.5, 1.5) * SUPERSAMPLE
            draw.ellipse([*(centre - r), *(centre + r)], fill=colour)


def _draw_shape_mask(name, side, centre, radius, angle):
    """An 8-bit mask of the shape (255 inside) at supersampled resolution."""
    mask = Image.new("L", (side, side), 0)
    draw = ImageDraw.Draw(mask)
    cx, cy = centre
    if name in _ROUND:
        outer, hole, offset = _ROUND[name]
        draw.ellipse([cx - outer * radius, cy - outer * radius,
                      cx + outer * radius, cy + outer * radius], fill=255)
        if hole:
            hx = cx + offset * radius * math.cos(angle)
            hy = cy + offset * radius * math.sin(angle)
            draw.ellipse([hx - hole * radius, hy - hole * radius,
                          hx + hole * radius, hy + hole * radius], fill=0)
    else:
        c, s = math.cos(angle), math.sin(angle)
        draw.polygon([(cx + radius * (x * c - y * s), cy + radius * (x * s + y * c))
                      for x, y in _POLYGONS[name]], fill=255)
    return mask


def draw_image(name, rng, image_size=IMAGE_SIZE, difficulty=DIFFICULTIES["default"]):
    """One RGB image of the class `name`, all randomness from the generator `rng`."""
    side = image_size * SUPERSAMPLE
    background, foreground = _colours(rng, difficulty.min_contrast)
    canvas = Image.new("RGB", (side, side), background)
    _draw_distractors(ImageDraw.Draw(canvas), rng, side, difficulty.distractors)
    radius = rng.uniform(*difficulty.shape_radius) * side
    centre = rng.uniform(radius, side - radius, 2)
    mask = _draw_shape_mask(name, side, centre, radius, rng.uniform(0, 2 * math.pi))
    canvas.paste(foreground, mask=mask)
    small = np.asarray(canvas.resize((image_size, image_size), Image.Resampling.BOX),
                       dtype=np.float32)
    noisy = small + rng.normal(0, rng.uniform(*difficulty.noise_sigma), small.shape)
    return Image.fromarray(np.clip(np.rint(noisy), 0, 255).astype(np.uint8))


def flipped_labels(seed, class_id, count, fraction):
    """The class each of a class's `count` training images is filed under: exactly
    round(fraction·count) of them, chosen at random, under another class drawn uniformly."""
    rng = np.random.default_rng([seed, LABEL_NOISE_STREAM, class_id])
    labels = np.full(count, class_id)
    flipped = rng.choice(count, size=round(fraction * count), replace=False)
    others = rng.integers(1, len(EMBEDDED_CLASSES), size=len(flipped))  # an offset: never the class itself
    labels[flipped] = (class_id + others) % len(EMBEDDED_CLASSES)
    return labels


def _write_class(split_dir, seed, split_id, class_id, labels, image_size, difficulty):
    """Draw a class's images; image i goes into the folder of class labels[i]."""
    name = EMBEDDED_CLASSES[class_id]
    (split_dir / name).mkdir(parents=True, exist_ok=True)
    for i, label in enumerate(labels):
        rng = np.random.default_rng([seed, split_id, class_id, i])
        image = draw_image(name, rng, image_size, DIFFICULTIES[difficulty])
        folder = split_dir / EMBEDDED_CLASSES[label]
        folder.mkdir(exist_ok=True)
        image.save(folder / (f"{i:05d}.png" if label == class_id else f"{i:05d}-from-{name}.png"))


def _write_tree(folder, seed, counts, image_size, difficulty, label_noise):
    """Write every split's class folders, one task per class, in parallel on all cores."""
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        tasks = []
        for split_id, (split, count) in enumerate(counts.items()):
            for class_id in range(len(EMBEDDED_CLASSES)):
                noise = label_noise if split == "train" else 0.0
                labels = flipped_labels(seed, class_id, count, noise)
                tasks.append(pool.submit(_write_class, folder / split, seed, split_id, class_id, labels,
                                         image_size, difficulty))
        for task in tasks:
            task.result()  # re-raises a worker's exception


def _write_json(path, data):
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _read_manifest(root):
    try:
        return json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def make_embedded_dataset(root, seed=0, train_per_class=TRAIN_PER_CLASS,
                          val_per_class=VAL_PER_CLASS, image_size=IMAGE_SIZE, difficulty="default",
                          label_noise=0.0):
    """Make (or find cached) the embedded dataset under `root`; return `root` as a Path.
    `difficulty` names one of DIFFICULTIES; `label_noise` is the fraction of each class's
    training images filed under another class.

    The tree is written into a temporary sibling folder, the manifest last, and then renamed
    to `root`: a folder named `root` with a matching manifest is always complete.
    """
    root = Path(root)
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose one of {sorted(DIFFICULTIES)}")
    if not 0 <= label_noise < 1:
        raise ValueError(f"label_noise {label_noise} is not a fraction in [0, 1)")
    manifest = {"version": GENERATOR_VERSION, "seed": seed, "image_size": image_size,
                "train_per_class": train_per_class, "val_per_class": val_per_class,
                "classes": list(EMBEDDED_CLASSES), "difficulty": difficulty}
    if label_noise:  # only then: clean datasets cached before the option keep their manifest
        manifest["label_noise"] = label_noise
    existing = _read_manifest(root)
    if existing == manifest:
        return root
    if existing is None and root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise UserError(f"{root} exists and is not an embedded dataset: give the embedded "
                        "dataset a new or empty folder")
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        _write_tree(tmp, seed, {"train": train_per_class, "val": val_per_class}, image_size, difficulty,
                    label_noise)
        _write_json(tmp / MANIFEST, manifest)
        _move_into_place(tmp, root, manifest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already unless something failed
    return root


def _move_into_place(tmp, root, manifest):
    """Rename the finished `tmp` to `root`, replacing an empty folder or an outdated dataset."""
    current = _read_manifest(root)
    if current == manifest:  # another process finished the same dataset first
        return
    if current is None:
        if root.exists():
            root.rmdir()  # empty: checked before generating
        tmp.rename(root)
    else:  # an embedded dataset made with other parameters: swap it out, then delete it
        old = tmp.with_name(tmp.name + "-old")
        root.rename(old)
        tmp.rename(root)
        shutil.rmtree(old)
