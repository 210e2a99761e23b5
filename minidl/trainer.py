"""The training loop: data -> model -> loss -> backward -> optimizer, then evaluation and logs.

`run(config)` trains for `config.epochs` epochs and returns the summary. Per epoch it
appends one JSON object to `<output_dir>/metrics.jsonl`; at the end it writes
`<output_dir>/summary.json` (atomically) and `<output_dir>/config.json`.
"""
import json
import time
from pathlib import Path

import numpy
from tqdm import tqdm

from minidl import nn, ops
from minidl.autograd import Tensor, no_grad
from minidl.backend import to_numpy, xp
from minidl.data import (DataLoader, FolderDataset, build_transform, build_val_transform,
                         check_folder_layout, make_embedded_dataset, normalize)
from minidl.errors import UserError
from minidl.fileio import append_json_line, write_json_atomic
from minidl.models import MODELS
from minidl.optim import SGD
from minidl.schedule import LRSchedule

EMBEDDED_DATASET_SEED = 0  # the embedded dataset is fixed; --seed varies the run, not the data


def dataset_root(config):
    if config.data_path:
        check_folder_layout(config.data_path)
        return Path(config.data_path)
    return make_embedded_dataset(Path(config.cache_dir) / "embedded", seed=EMBEDDED_DATASET_SEED)


def build_loaders(config, root):
    train_set, val_set = FolderDataset(root, "train"), FolderDataset(root, "val")
    train = DataLoader(train_set, config.batch_size, build_transform(config.augment, config.train_crop_size),
                       shuffle=True, seed=config.seed, workers=config.workers, drop_last=True)
    val = DataLoader(val_set, config.batch_size, build_val_transform(config.val_resize_size, config.val_crop_size),
                     workers=config.workers)
    return train, val, len(train_set.classes)


def build_optimizer(config, model):
    return SGD(model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
               nesterov=config.nesterov, norm_weight_decay=config.norm_weight_decay)


def count_correct(logits, labels, k):
    """How many rows have their label among the k largest logits."""
    k = min(k, logits.shape[1])
    top = numpy.argpartition(-logits, k - 1, axis=1)[:, :k]
    return int((top == labels[:, None]).any(axis=1).sum())


def train_one_epoch(model, optimizer, schedule, loader, epoch, config):
    model.train()
    loader.set_epoch(epoch)
    iteration = epoch * len(loader)
    loss_sum, images, start = 0.0, 0, time.perf_counter()
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{config.epochs}", unit="batch", leave=False,
               dynamic_ncols=True)
    for step, (batch, labels) in enumerate(bar):
        optimizer.lr = schedule(iteration + step)
        logits = model(Tensor(normalize(batch, xp)))
        loss = ops.softmax_cross_entropy(logits, xp.asarray(labels), config.label_smoothing)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_sum += float(loss.data) * len(labels)
        images += len(labels)
        if (step + 1) % config.print_freq == 0:
            bar.set_postfix(loss=f"{loss_sum / images:.4f}", lr=f"{optimizer.lr:.4g}",
                            img_s=f"{images / (time.perf_counter() - start):.0f}")
    seconds = time.perf_counter() - start
    return {"train_loss": loss_sum / max(images, 1), "images_per_sec": images / seconds, "lr": optimizer.lr}


def evaluate(model, loader, label_smoothing):
    model.eval()
    loss_sum, top1, top5, count = 0.0, 0, 0, 0
    with no_grad():
        for batch, labels in loader:
            logits = model(Tensor(normalize(batch, xp)))
            loss = ops.softmax_cross_entropy(logits, xp.asarray(labels), label_smoothing)
            host_logits = to_numpy(logits.data)
            loss_sum += float(loss.data) * len(labels)
            top1 += count_correct(host_logits, labels, 1)
            top5 += count_correct(host_logits, labels, 5)
            count += len(labels)
    return {"val_loss": loss_sum / count, "val_top1": top1 / count, "val_top5": top5 / count}


def summary_line(metrics, epochs):
    return (f"epoch {metrics['epoch']}/{epochs}  train loss {metrics['train_loss']:.4f}  "
            f"val loss {metrics['val_loss']:.4f}  top1 {100 * metrics['val_top1']:.2f}%  "
            f"top5 {100 * metrics['val_top5']:.2f}%  lr {metrics['lr']:.4g}  "
            f"{metrics['images_per_sec']:.0f} img/s  {metrics['seconds']:.1f} s")


def run(config):
    """Train as `config` says; return the summary (also written to summary.json)."""
    config = config.resolved()
    wall_start = time.perf_counter()
    root = dataset_root(config)
    train_loader, val_loader, num_classes = build_loaders(config, root)
    if len(train_loader) == 0:
        raise UserError(f"the training set has {len(train_loader.dataset)} images, fewer than one "
                        f"batch of {config.batch_size}: lower --batch-size")
    nn.manual_seed(config.seed)
    model = MODELS[config.model](num_classes=num_classes)
    optimizer = build_optimizer(config, model)
    schedule = LRSchedule(config.lr, len(train_loader), config.epochs, config.lr_scheduler,
                          config.lr_steps, config.lr_gamma)

    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(output_dir / "config.json", config.to_dict())
    metrics_path = output_dir / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)  # a fresh run starts a fresh log
    print(f"minidl: training {config.model} ({model.num_parameters():,} parameters) on "
          f"{len(train_loader.dataset):,} images of {num_classes} classes from {root}, "
          f"batch {config.batch_size}, {config.epochs} epochs, {xp.__name__}")

    metrics = {}
    for epoch in range(config.epochs):
        epoch_start = time.perf_counter()
        metrics = {"epoch": epoch + 1}
        metrics.update(train_one_epoch(model, optimizer, schedule, train_loader, epoch, config))
        metrics.update(evaluate(model, val_loader, config.label_smoothing))
        metrics["seconds"] = time.perf_counter() - epoch_start
        append_json_line(metrics_path, metrics)
        print(summary_line(metrics, config.epochs), flush=True)

    summary = dict(metrics, model=config.model, epochs=config.epochs,
                   wall_time=time.perf_counter() - wall_start, output_dir=str(output_dir))
    write_json_atomic(output_dir / "summary.json", summary)
    print(f"minidl: done in {summary['wall_time']:.1f} s, val top-1 {100 * summary['val_top1']:.2f}%; "
          f"metrics in {metrics_path}")
    return summary

