"""The training loop: data -> model -> loss -> backward -> optimizer, then evaluation and logs.

`run(config)` trains for `config.epochs` epochs and returns the summary. Per epoch it
appends one JSON object to `<output_dir>/metrics.jsonl`; at the end it writes
`<output_dir>/summary.json` (atomically); `<output_dir>/config.json` holds the effective
configuration.

One optimizer step consumes the epoch's global batch: `accum_steps` micro-batches per rank,
their gradients summed in the flat buffer. The loss is a mean over each micro-batch, so the
optimizer's `grad_scale` = 1 / (ranks × accum_steps) turns the sum into the mean over the
global batch (Goyal et al., remark 3) without a separate pass over the gradients.
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
from minidl.data.embedded import EMBEDDED_CLASSES, TRAIN_PER_CLASS
from minidl.errors import UserError
from minidl.fileio import append_json_line, write_json_atomic
from minidl.models import MODELS
from minidl.optim import LARS, SGD
from minidl.schedule import LRSchedule, epoch_table

EMBEDDED_DATASET_SEED = 0  # the embedded dataset is fixed; --seed varies the run, not the data


def dataset_root(config):
    if config.data_path:
        check_folder_layout(config.data_path)
        return Path(config.data_path)
    return make_embedded_dataset(Path(config.cache_dir) / "embedded", seed=EMBEDDED_DATASET_SEED)


def train_dataset_size(config):
    """Training images, counted without decoding any (the embedded dataset's size is known)."""
    if not config.data_path:
        return TRAIN_PER_CLASS * len(EMBEDDED_CLASSES)
    return len(FolderDataset(config.data_path, "train"))


def build_schedule(config, world_size):
    return LRSchedule(config.lr, config.lr_base_batch, config.batches(world_size), config.epochs,
                      config.lr_scheduler, tuple(config.lr_steps), config.lr_gamma, config.lr_power,
                      config.lr_warmup_epochs, config.lr_warmup_method, config.lr_warmup_start)


def schedule_rows(config, world_size, dataset_size=None):
    """The per-epoch batch layout and rate (`--print-schedule`)."""
    dataset_size = train_dataset_size(config) if dataset_size is None else dataset_size
    return epoch_table(build_schedule(config, world_size), world_size, dataset_size, config.max_per_rank_batch)


def build_model(config, num_classes):
    nn.manual_seed(config.seed)
    return MODELS[config.model](num_classes=num_classes, zero_init_residual=config.zero_init_residual)


def build_optimizer(config, model):
    common = dict(lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
                  norm_weight_decay=config.norm_weight_decay)
    if config.opt == "lars":
        return LARS(model.parameters(), eta=config.lars_eta, **common)
    return SGD(model.parameters(), nesterov=config.nesterov, **common)


def count_correct(logits, labels, k):
    """How many rows have their label among the k largest logits."""
    k = min(k, logits.shape[1])
    top = numpy.argpartition(-logits, k - 1, axis=1)[:, :k]
    return int((top == labels[:, None]).any(axis=1).sum())


class Trainer:
    def __init__(self, config, world_size=1):
        self.config, self.world_size = config, world_size
        root = dataset_root(config)
        self.train_set, self.val_set = FolderDataset(root, "train"), FolderDataset(root, "val")
        self.root = root
        self.schedule = build_schedule(config, world_size)
        self.model = build_model(config, len(self.train_set.classes))
        self.optimizer = build_optimizer(config, self.model)
        self.train_transform = build_transform(config.augment, config.train_crop_size)
        self.val_loader = DataLoader(self.val_set, self.plan(0).micro_batch,
                                     build_val_transform(config.val_resize_size, config.val_crop_size),
                                     workers=config.workers)
        self.train_loader = None

    def plan(self, epoch):
        return self.schedule.batches.plan(epoch, self.world_size, self.config.max_per_rank_batch)

    def train_loader_for(self, micro_batch):
        """The training loader, rebuilt only when batch-size control changes the micro-batch."""
        if self.train_loader is None or self.train_loader.batch_size != micro_batch:
            self.train_loader = DataLoader(self.train_set, micro_batch, self.train_transform, shuffle=True,
                                           seed=self.config.seed, workers=self.config.workers, drop_last=True)
        return self.train_loader

    def train_one_epoch(self, epoch):
        config, model, optimizer = self.config, self.model, self.optimizer
        plan = self.plan(epoch)
        loader = self.train_loader_for(plan.micro_batch)
        loader.set_epoch(epoch)
        steps = len(loader) // plan.accum_steps
        if steps == 0:
            raise UserError(f"the training set ({len(self.train_set)} images) is smaller than the global batch "
                            f"{plan.global_batch} of epoch {epoch}: lower the batch size")
        optimizer.grad_scale = 1.0 / (self.world_size * plan.accum_steps)
        model.train()
        batches = iter(loader)
        loss_sum, images, start = 0.0, 0, time.perf_counter()
        bar = tqdm(range(steps), desc=f"epoch {epoch + 1}/{config.epochs}", unit="step", leave=False,
                   dynamic_ncols=True)
        for step in bar:
            optimizer.lr = self.schedule(epoch + step / steps)
            optimizer.zero_grad()
            for _ in range(plan.accum_steps):
                batch, labels = next(batches)
                logits = model(Tensor(normalize(batch, xp)))
                loss = ops.softmax_cross_entropy(logits, xp.asarray(labels), config.label_smoothing)
                loss.backward()
                loss_sum += float(loss.data) * len(labels)
                images += len(labels)
            optimizer.step()
            if (step + 1) % config.print_freq == 0:
                bar.set_postfix(loss=f"{loss_sum / images:.4f}", lr=f"{optimizer.lr:.4g}",
                                img_s=f"{images / (time.perf_counter() - start):.0f}")
        seconds = time.perf_counter() - start
        return {"train_loss": loss_sum / images, "images_per_sec": images / seconds, "lr": optimizer.lr,
                "global_batch": plan.global_batch}

    def evaluate(self):
        model = self.model
        model.eval()
        loss_sum, top1, top5, count = 0.0, 0, 0, 0
        with no_grad():
            for batch, labels in self.val_loader:
                logits = model(Tensor(normalize(batch, xp)))
                loss = ops.softmax_cross_entropy(logits, xp.asarray(labels), self.config.label_smoothing)
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
            f"batch {metrics['global_batch']}  {metrics['images_per_sec']:.0f} img/s  {metrics['seconds']:.1f} s")


def run(config):
    """Train as `config` says; return the summary (also written to summary.json)."""
    config = config.resolved()
    wall_start = time.perf_counter()
    trainer = Trainer(config)
    model = trainer.model

    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(output_dir / "config.json", config.to_dict())
    metrics_path = output_dir / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)  # a fresh run starts a fresh log
    print("minidl: config " + json.dumps({k: v for k, v in config.to_dict().items() if v is not None}))
    print(f"minidl: training {config.model} ({model.num_parameters():,} parameters) on "
          f"{len(trainer.train_set):,} images of {len(trainer.train_set.classes)} classes from {trainer.root}, "
          f"{config.epochs} epochs, {xp.__name__}")

    metrics = {}
    for epoch in range(config.epochs):
        epoch_start = time.perf_counter()
        metrics = {"epoch": epoch + 1}
        metrics.update(trainer.train_one_epoch(epoch))
        metrics.update(trainer.evaluate())
        metrics["seconds"] = time.perf_counter() - epoch_start
        append_json_line(metrics_path, metrics)
        print(summary_line(metrics, config.epochs), flush=True)

    summary = dict(metrics, model=config.model, epochs=config.epochs, world_size=trainer.world_size,
                   wall_time=time.perf_counter() - wall_start, output_dir=str(output_dir))
    write_json_atomic(output_dir / "summary.json", summary)
    print(f"minidl: done in {summary['wall_time']:.1f} s, val top-1 {100 * summary['val_top1']:.2f}%; "
          f"metrics in {metrics_path}")
    return summary
