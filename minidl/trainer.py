"""The training loop: data -> model -> loss -> backward -> all-reduce -> optimizer, then evaluation.

`run(config)` trains and returns the summary. Only rank 0 prints and writes files:
`config.json` (the effective configuration), `metrics.jsonl` (one object per epoch),
`steps.jsonl` (every --print-freq steps: loss, rate, throughput and where the time went),
checkpoints, and at the end `summary.json`.

One optimizer step consumes the epoch's global batch: each rank takes `accum_steps`
micro-batches of its share of one global permutation (Goyal et al., remark 4), their gradients
summed in the flat buffer, then the ranks SUM their buffers (overlapped with the last
backward). The loss is a mean over each micro-batch, so the optimizer's
grad_scale = 1 / (ranks × accum_steps) turns that sum into the mean over the global batch
(remark 3) without a pass over the gradients. BN statistics stay per rank during training;
before each evaluation the ranks average their running statistics.

A run is a pure function of its configuration and its checkpoint: data order and
augmentation come from (seed, epoch, index), so a resumed run — mid-epoch included —
continues exactly where the checkpoint was taken (bit for bit on CPU with the same world size).
SIGTERM/SIGINT finish the current step, write a checkpoint and return; a non-finite loss
saves a diagnostic checkpoint beside the regular ones and stops with an error.

GPU only: `--amp` computes the activations in bf16 (minidl.backend's dtype policy); with
`--cuda-graph` a single-process SGD run replays each step from a CUDA graph (minidl.graph): the
step never waits for the device, its loss stays there and is read every --print-freq steps and
at the epoch's end, so a non-finite loss stops the run at the next such check, with the state
after it in the diagnostic checkpoint; the time split then has no device synchronization
either: the data wait, and the whole replayed step under "forward". Runs that cannot be
captured (several processes, LARS, micro-batch accumulation) step eagerly and say so.
"""
import dataclasses
import json
import math
import os
import socket
import time
from pathlib import Path

import numpy
from tqdm import tqdm

from minidl import dist, kernels, nn, ops
from minidl.autograd import Tensor, no_grad
from minidl.backend import autocast, on_gpu, synchronize, to_numpy, xp
from minidl.checkpoint import (CheckpointDir, check_compatible, load_checkpoint, restore_training_state,
                               training_state)
from minidl.data import (DataLoader, DistributedSampler, build_transform, build_val_transform,
                         make_embedded_dataset, normalize, open_dataset)
from minidl.data.embedded import EMBEDDED_CLASSES, TRAIN_PER_CLASS
from minidl.device_step import DeviceStep
from minidl.errors import UserError
from minidl.fileio import append_json_line, write_bytes_atomic, write_json_atomic
from minidl.graph import GraphedStep
from minidl.models import MODELS
from minidl.optim import LARS, SGD
from minidl.preemption import StopRequest
from minidl.schedule import LRSchedule, epoch_table
from minidl.steplog import StepTimer

EMBEDDED_DATASET_SEED = 0  # the embedded dataset is fixed; --seed varies the run, not the data


class TrainingStopped(Exception):
    """The run cannot go on (e.g. a non-finite loss); the message says why and what was saved."""


def train_dataset_size(config):
    """Training images, counted without decoding any (the embedded dataset's size is known)."""
    if not config.data_path:
        return TRAIN_PER_CLASS * len(EMBEDDED_CLASSES)
    return len(open_dataset(config.data_path, "train"))


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
    model = MODELS[config.model](num_classes=num_classes, zero_init_residual=config.zero_init_residual)
    for _, module in model.named_modules():
        if isinstance(module, nn.BatchNorm2d):
            module.group_size = config.bn_group_size
    return model


def build_optimizer(config, model, align):
    common = dict(lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
                  norm_weight_decay=config.norm_weight_decay, align=align,
                  momentum_correction=config.momentum_correction)
    if config.opt == "lars":
        return LARS(model.parameters(), eta=config.lars_eta, **common)
    return SGD(model.parameters(), nesterov=config.nesterov, form=config.sgd_form, **common)


def count_correct(logits, labels, k):
    """How many rows have their label among the k largest logits."""
    k = min(k, logits.shape[1])
    top = numpy.argpartition(-logits, k - 1, axis=1)[:, :k]
    return int((top == labels[:, None]).any(axis=1).sum())


class Trainer:
    """Everything a run holds: communicator, data, model, optimizer, schedule, position."""

    def __init__(self, config, comm):
        self.config, self.comm = config, comm
        self.is_root = comm.rank == 0
        self.root = self._dataset_root()
        self.train_set, self.val_set = open_dataset(self.root, "train"), open_dataset(self.root, "val")
        self.schedule = build_schedule(config, comm.size)
        self.allreduce = dist.AllReduce(comm, config.allreduce,
                                        dist.parse_shape(config.torus_shape) if config.torus_shape else None)
        self.model = build_model(config, len(self.train_set.classes))
        dist.broadcast_state(comm, self.model.state_dict().values())
        self.optimizer = build_optimizer(config, self.model, math.lcm(1024, self.allreduce.alignment))
        self.reducer = dist.GradientReducer(self.allreduce, self.optimizer.flat, config.bucket_mb)
        # --amp: the bf16 copy of the weights that the convolutions read, refreshed before each forward
        self.shadow = kernels.device().bf16_shadow(self.optimizer.flat.data) if config.amp else None
        self.device_step = self._device_step_to_capture()  # None: every step runs eagerly
        self.graphed, self.nonfinite_seen = None, 0  # the captured step of this micro-batch size
        self.train_transform = build_transform(config.augment, config.train_crop_size)
        val_sampler = DistributedSampler(len(self.val_set), comm.rank, comm.size, shuffle=False, pad=False)
        self.val_loader = DataLoader(self.val_set, self.plan(0).micro_batch,
                                     build_val_transform(config.val_resize_size, config.val_crop_size),
                                     workers=config.workers, sampler=val_sampler, to_device=on_gpu)
        self.train_loader = None
        self.checkpoints = CheckpointDir(config.output_dir, config.keep_checkpoints)
        self.timer = StepTimer(synchronize if self.device_step is None else lambda: None)
        # the position: epoch, steps done in it, optimizer steps done in all; this epoch's sums
        self.epoch, self.step, self.iteration = 0, 0, 0
        self.totals = self._fresh_totals()

    def _dataset_root(self):
        if self.config.data_path:
            return Path(self.config.data_path)
        root = Path(self.config.cache_dir) / "embedded"
        if self.is_root:  # one rank generates, the others wait for it
            make_embedded_dataset(root, seed=EMBEDDED_DATASET_SEED)
        self.comm.barrier()
        return root

    @staticmethod
    def _fresh_totals():
        return {"loss_sum": 0.0, "images": 0, "skipped": 0}

    def any_rank(self, *flags):
        """For each flag, whether it is true on any rank: decisions that change the collectives
        every rank makes (stop now, save now) must be the same on all of them. Collective."""
        if self.comm.size > 1:
            flags = self.comm.sum(flags) > 0
        return tuple(bool(flag) for flag in flags)

    def plan(self, epoch):
        plan = self.schedule.batches.plan(epoch, self.comm.size, self.config.max_per_rank_batch)
        group = self.config.bn_group_size
        if group and plan.micro_batch > group and plan.micro_batch % group:
            raise UserError(f"--bn-group-size {group} does not divide the micro-batch of {plan.micro_batch} images "
                            f"per rank (epoch {epoch}): choose a divisor of it")
        return plan

    def train_loader_for(self, micro_batch):
        """The training loader, rebuilt only when batch-size control changes the micro-batch."""
        if self.train_loader is None or self.train_loader.batch_size != micro_batch:
            sampler = DistributedSampler(len(self.train_set), self.comm.rank, self.comm.size, self.config.seed,
                                         shuffle=True, drop_last=True)
            self.train_loader = DataLoader(self.train_set, micro_batch, self.train_transform, seed=self.config.seed,
                                           workers=self.config.workers, drop_last=True, sampler=sampler,
                                           to_device=on_gpu)
        return self.train_loader

    # --- checkpoints ---------------------------------------------------------------------

    def state(self):
        """(arrays, meta) of the whole run at this position. Collective: every rank calls."""
        self.settle_device_totals()
        arrays, meta = training_state(self.model, self.optimizer)
        ranks = self.comm.allgather_object({"totals": self.totals, "buffers": {
            name: to_numpy(array) for name, array in self.model.named_buffers()}})
        for rank, entry in enumerate(ranks):  # BN statistics are per rank
            arrays.update((f"rank{rank}/{name}", array) for name, array in entry["buffers"].items())
        meta.update(model=self.config.model, config=self.config.to_dict(), epoch=self.epoch, step=self.step,
                    iteration=self.iteration, world_size=self.comm.size, lr=self.optimizer.lr,
                    batch_schedule=str(self.schedule.batches), totals=[entry["totals"] for entry in ranks])
        return arrays, meta

    def save_checkpoint(self, diagnostic=False):
        arrays, meta = self.state()
        if not self.is_root:
            return None
        if diagnostic:
            return self.checkpoints.save_diagnostic(arrays, meta, self.iteration)
        return self.checkpoints.save(arrays, meta, self.epoch, self.iteration)

    def resume(self, path, arrays, meta):
        check_compatible(path, meta, self.config.model, self.model.num_parameters())
        same_world = meta["world_size"] == self.comm.size
        if meta["step"] and not same_world:
            raise UserError(f"checkpoint {path} was taken mid-epoch by {meta['world_size']} ranks, whose split "
                            f"of the epoch {self.comm.size} ranks cannot continue: resume with "
                            f"{meta['world_size']} processes, or from a checkpoint taken at an epoch's end")
        restore_training_state(path, arrays, meta, self.model, self.optimizer)
        rank = self.comm.rank if same_world else 0  # at an epoch's end the ranks' statistics agree
        for name, buffer in self.model.named_buffers():
            buffer[...] = xp.asarray(arrays[f"rank{rank}/{name}"])
        self.epoch, self.step, self.iteration = meta["epoch"], meta["step"], meta["iteration"]
        self.totals = dict(meta["totals"][rank]) if same_world else self._fresh_totals()

    # --- training --------------------------------------------------------------------------

    def notice(self, message):
        if self.is_root:
            print(f"minidl: {message}", flush=True)

    def _device_step_to_capture(self):
        """--cuda-graph: the DeviceStep the graphs capture, or None where the run steps eagerly."""
        if not self.config.cuda_graph:
            return None
        if self.comm.size > 1 or self.config.opt != "sgd":
            why = f"{self.comm.size} processes" if self.comm.size > 1 else f"--opt {self.config.opt}"
            self.notice(f"--cuda-graph captures single-process SGD runs; with {why} every step runs eagerly")
            return None
        return DeviceStep(self.model, self.optimizer, self.config.label_smoothing, self.config.amp)

    def graph_for(self, plan):
        """The captured step for this epoch's micro-batch, or None: its steps run eagerly."""
        if self.device_step is None:
            return None
        if plan.accum_steps > 1:
            self.notice(f"--cuda-graph: epoch {self.epoch + 1} accumulates {plan.accum_steps} micro-batches per "
                        "step, which is not captured: its steps run eagerly")
            return None
        shape = (plan.micro_batch, *self.train_transform.output_shape)
        if self.graphed is None or self.graphed.images.shape != shape:
            self.graphed = None  # the old graph's memory goes back before the new one's is taken
            self.graphed = GraphedStep(self.device_step, self.optimizer, shape)
        return self.graphed

    def refresh_shadow(self):
        """The bf16 copy of the weights (--amp) as the last update left them: once per step and
        before evaluating, not per micro-batch or per validation batch."""
        if self.shadow is not None:
            self.shadow.refresh()

    def forward_loss(self, images, labels):
        with autocast(self.config.amp):
            logits = self.model(Tensor(normalize(images, xp)))
        return logits, ops.softmax_cross_entropy(logits, xp.asarray(labels), self.config.label_smoothing)

    def train_step(self, batches, plan, steps):
        """One optimizer step over `accum_steps` micro-batches; returns whether a loss was non-finite."""
        optimizer, timer = self.optimizer, self.timer
        optimizer.lr = self.schedule(self.epoch + self.step / steps)
        optimizer.zero_grad()
        self.refresh_shadow()
        timer.start()
        nonfinite = False
        for k in range(plan.accum_steps):
            images, labels = next(batches)
            timer.mark("data")
            if len(labels) == 0:  # every image of the batch was undecodable
                continue
            _, loss = self.forward_loss(images, labels)
            timer.mark("forward")
            self.reducer.backward(loss) if k == plan.accum_steps - 1 else loss.backward()
            timer.mark("backward")
            value = float(loss.data)
            nonfinite |= not math.isfinite(value)
            self.totals["loss_sum"] += value * len(labels)
            self.totals["images"] += len(labels)
        self.reducer.wait()
        timer.mark("allreduce")
        return nonfinite

    def graph_train_step(self, graphed, batches, steps):
        """One optimizer step replayed from its CUDA graph, update included; returns whether a
        non-finite loss was seen since the last check (only every --print-freq steps and at the
        epoch's end: the check waits for the device)."""
        self.optimizer.lr = self.schedule(self.epoch + self.step / steps)
        self.timer.start()
        images, labels = next(batches)
        self.timer.mark("data")
        if len(labels):
            graphed(images, labels)
            self.totals["images"] += len(labels)
        else:  # every image was undecodable: the update still happens, from no gradient, as eagerly
            self.optimizer.zero_grad()
            self.optimizer.step()
        self.timer.mark("forward")
        if (self.step + 1) % self.config.print_freq and self.step + 1 < steps:
            return False
        self.settle_device_totals()
        seen, self.nonfinite_seen = self.nonfinite_seen, 0
        return seen > 0

    def settle_device_totals(self):
        """Move the loss summed on the device into the totals (a wait for the device)."""
        if self.device_step is not None:
            loss_sum, nonfinite = self.device_step.take_totals()
            self.totals["loss_sum"] += loss_sum
            self.nonfinite_seen += nonfinite

    def train_epoch(self, stop):
        """Train from the current position to the end of the epoch, or until asked to stop.
        Returns True when the epoch is complete."""
        config, comm = self.config, self.comm
        plan = self.plan(self.epoch)
        loader = self.train_loader_for(plan.micro_batch)
        steps = len(loader) // plan.accum_steps
        if steps == 0:
            raise UserError(f"the training set ({len(self.train_set)} images) is smaller than the global batch "
                            f"{plan.global_batch} of epoch {self.epoch}: lower the batch size")
        loader.set_epoch(self.epoch, start_batch=self.step * plan.accum_steps)
        self.optimizer.grad_scale = 1.0 / (comm.size * plan.accum_steps)
        self.model.train()
        graphed = self.graph_for(plan)
        batches, skipped_before = iter(loader), self.totals["skipped"]
        window_start, window_images = time.perf_counter(), 0
        bar = tqdm(total=steps, initial=self.step, desc=f"epoch {self.epoch + 1}/{config.epochs}", unit="step",
                   leave=False, dynamic_ncols=True, disable=not self.is_root)
        while self.step < steps:
            nonfinite = (self.train_step(batches, plan, steps) if graphed is None
                         else self.graph_train_step(graphed, batches, steps))
            nonfinite, stopping = self.any_rank(nonfinite, stop.requested is not None)
            self.totals["skipped"] = skipped_before + loader.skipped
            if nonfinite:
                path = self.save_checkpoint(diagnostic=True)
                where = (f"at iteration {self.iteration + 1} (epoch {self.epoch + 1}, step {self.step + 1}); "
                         f"the state before it" if graphed is None else
                         f"by iteration {self.iteration + 1} (epoch {self.epoch + 1}, step {self.step + 1}; "
                         f"--cuda-graph checks every --print-freq steps); the state after it")
                raise TrainingStopped(f"non-finite loss {where} is saved in {path}: lower --lr or lengthen the "
                                      f"warmup, then --resume from the last regular checkpoint")
            if graphed is None:  # a replayed step has updated the weights already
                self.optimizer.step()
            self.timer.mark("optimizer")
            self.timer.end_step()
            self.step += 1
            self.iteration += 1
            window_images += plan.global_batch
            bar.update(1)
            if self.step % config.print_freq == 0 or self.step == steps:
                self.log_steps(bar, plan, steps, window_images / (time.perf_counter() - window_start))
                window_start, window_images = time.perf_counter(), 0
            if stopping:
                bar.close()
                return False
            if config.checkpoint_every and self.iteration % config.checkpoint_every == 0 and self.step < steps:
                self.save_checkpoint()
        bar.close()
        return True

    def log_steps(self, bar, plan, steps, images_per_sec):
        split = self.timer.report()
        totals = self.comm.sum([self.totals["loss_sum"], self.totals["images"]])
        record = {"iteration": self.iteration, "epoch": self.epoch + self.step / steps,
                  "loss": totals[0] / max(totals[1], 1), "lr": self.optimizer.lr, "global_batch": plan.global_batch,
                  "img_per_s": images_per_sec, **split}
        if self.is_root:
            append_json_line(Path(self.config.output_dir) / "steps.jsonl", record)
            times = "/".join(f"{1e3 * seconds:.0f}" for seconds in split.values())
            bar.set_postfix_str(f"loss {record['loss']:.4f}, lr {record['lr']:.4g}, {images_per_sec:.0f} img/s, "
                                f"ms {'/'.join(split)} {times}")

    def average_bn_statistics(self):
        """Make every rank's BN running statistics their mean over ranks (before evaluation)."""
        if self.comm.size > 1:
            for _, buffer in self.model.named_buffers():
                self.comm.allreduce(buffer)
                buffer /= self.comm.size

    def evaluate(self):
        self.average_bn_statistics()
        self.refresh_shadow()
        self.model.eval()
        loss_sum, top1, top5, count = 0.0, 0, 0, 0
        with no_grad():
            for images, labels in self.val_loader:
                if len(labels) == 0:
                    continue
                logits, loss = self.forward_loss(images, labels)
                host_logits = to_numpy(logits.data)
                loss_sum += float(loss.data) * len(labels)
                top1 += count_correct(host_logits, labels, 1)
                top5 += count_correct(host_logits, labels, 5)
                count += len(labels)
        loss_sum, top1, top5, count, skipped = self.comm.sum([loss_sum, top1, top5, count, self.val_loader.skipped])
        return {"val_loss": loss_sum / count, "val_top1": top1 / count, "val_top5": top5 / count,
                "val_skipped": int(skipped)}

    def finish_epoch(self, seconds):
        """The epoch's metrics (over all ranks); then the position moves to the next epoch."""
        loss_sum, images, skipped = self.comm.sum([self.totals[k] for k in ("loss_sum", "images", "skipped")])
        metrics = {"epoch": self.epoch + 1, "train_loss": loss_sum / max(images, 1), "lr": self.optimizer.lr,
                   "global_batch": self.plan(self.epoch).global_batch, "images_per_sec": images / seconds,
                   "train_skipped": int(skipped)}
        metrics.update(self.evaluate())
        self.epoch, self.step, self.totals = self.epoch + 1, 0, self._fresh_totals()
        return metrics


def summary_line(metrics, epochs):
    line = (f"epoch {metrics['epoch']}/{epochs}  train loss {metrics['train_loss']:.4f}  "
            f"val loss {metrics['val_loss']:.4f}  top1 {100 * metrics['val_top1']:.2f}%  "
            f"top5 {100 * metrics['val_top5']:.2f}%  lr {metrics['lr']:.4g}  "
            f"batch {metrics['global_batch']}  {metrics['images_per_sec']:.0f} img/s  {metrics['seconds']:.1f} s")
    skipped = metrics["train_skipped"] + metrics["val_skipped"]
    return line + (f"  ({skipped} undecodable images skipped)" if skipped else "")


def keep_log_lines(path, keep):
    """Drop the lines of a JSON-lines log that `keep(record)` rejects (a resumed run rewrites them)."""
    if path.exists():
        lines = [line for line in path.read_text().splitlines() if line and keep(json.loads(line))]
        write_bytes_atomic(path, "".join(line + "\n" for line in lines).encode())


def find_resume_point(config):
    """(path, arrays, meta) to resume from, or None for a fresh start."""
    if config.resume is None:
        return None
    if config.resume == "auto":
        return CheckpointDir(config.output_dir, config.keep_checkpoints).load_latest()
    return (Path(config.resume), *load_checkpoint(config.resume))


def adopt_checkpoint_batches(config, meta):
    """A resumed run keeps its global batch: the checkpoint's schedule replaces -b."""
    return dataclasses.replace(config, batch_size=None, batch_schedule=meta["batch_schedule"])


def run(config):
    """Train as `config` says; return the summary (also written to summary.json)."""
    config = config.resolved()
    comm = dist.init(config.dist_backend or ("nccl" if on_gpu else "mpi"))
    resume_point = find_resume_point(config)
    if resume_point is not None:
        config = adopt_checkpoint_batches(config, resume_point[2])
    wall_start = time.perf_counter()
    trainer = Trainer(config, comm)
    output_dir = Path(config.output_dir)
    metrics_path, steps_path = output_dir / "metrics.jsonl", output_dir / "steps.jsonl"
    if resume_point is not None:
        trainer.resume(*resume_point)
    ranks = comm.allgather_object({"rank": comm.rank, "host": socket.gethostname(), "pid": os.getpid()})
    if trainer.is_root:
        output_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(output_dir / "config.json", config.to_dict())
        # a launcher reports a dead process by its PID: this maps it to a rank
        write_json_atomic(output_dir / "ranks.json", ranks)
        # the logs keep what happened before the resume point, nothing after it
        keep_log_lines(metrics_path, lambda m: m["epoch"] <= trainer.epoch)
        keep_log_lines(steps_path, lambda s: s["iteration"] <= trainer.iteration)
        print("minidl: config " + json.dumps({k: v for k, v in config.to_dict().items() if v is not None}))
        print(f"minidl: training {config.model} ({trainer.model.num_parameters():,} parameters) on "
              f"{len(trainer.train_set):,} images of {len(trainer.train_set.classes)} classes from {trainer.root}, "
              f"{config.epochs} epochs, {comm.size} process{'es' if comm.size > 1 else ''}, {xp.__name__}")
        if comm.size > 1:
            print("minidl: ranks (rank:host:pid) " + " ".join(f"{r['rank']}:{r['host']}:{r['pid']}" for r in ranks))
        if resume_point is not None:
            print(f"minidl: resumed from {resume_point[0]} at epoch {trainer.epoch + 1}, "
                  f"step {trainer.step}, iteration {trainer.iteration}")

    if trainer.epoch >= config.epochs:
        if trainer.is_root:
            print(f"minidl: the run in {output_dir} has finished its {config.epochs} epochs: raise --epochs to go on")
        return json.loads((output_dir / "summary.json").read_text()) if (output_dir / "summary.json").exists() else {}

    metrics, path, stopped = {}, None, False
    with StopRequest() as stop:
        while trainer.epoch < config.epochs and not stopped:
            epoch_start = time.perf_counter()
            if trainer.train_epoch(stop):
                metrics = trainer.finish_epoch(time.perf_counter() - epoch_start)
                metrics["seconds"] = time.perf_counter() - epoch_start
                if trainer.is_root:
                    append_json_line(metrics_path, metrics)
                    print(summary_line(metrics, config.epochs), flush=True)
                path = trainer.save_checkpoint()
                stopped, = trainer.any_rank(stop.requested is not None)
            else:  # asked to stop inside the epoch
                path, stopped = trainer.save_checkpoint(), True
    if stopped:
        if trainer.is_root:
            print(f"minidl: stopped by {stop.requested or 'a signal to another rank'} at iteration "
                  f"{trainer.iteration}; checkpoint {path}. Resume with: python train.py --resume auto "
                  f"--output-dir {output_dir} (and the same flags)")
        return {"preempted": True, "checkpoint": str(path), "iteration": trainer.iteration}

    summary = dict(metrics, model=config.model, epochs=config.epochs, world_size=comm.size,
                   global_batch=metrics.get("global_batch"), wall_time=time.perf_counter() - wall_start,
                   output_dir=str(output_dir))
    if trainer.is_root:
        write_json_atomic(output_dir / "summary.json", summary)
        print(f"minidl: done in {summary['wall_time']:.1f} s, val top-1 {100 * summary['val_top1']:.2f}%; "
              f"metrics in {metrics_path}")
    return summary
