"""Schedules of the large-minibatch recipe: global batch size and learning rate over training.

`BatchSchedule` gives the global (or per-rank) batch from each epoch on: batch-size control
(Mikami et al.). The rate is a function of the fractional epoch, so it changes every
iteration: the linear scaling rule, gradual or constant warmup, then step, poly, cosine or
constant decay (Goyal et al.).

Details: docs/recipe.md, "minidl/schedule.py".
"""
import bisect
import dataclasses
import math

from minidl.errors import UserError
from minidl.intmath import ceil_div

LR_SCHEDULERS = ("step", "poly", "cosine", "constant")
WARMUP_METHODS = ("linear", "constant")


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """How one epoch's global batch is laid out over ranks and accumulation steps."""
    global_batch: int
    per_rank_batch: int  # images one rank contributes to one optimizer step
    accum_steps: int     # micro-batches per optimizer step
    micro_batch: int     # images per forward/backward on one rank


class BatchSchedule:
    """The global batch size from each listed epoch on: [(0, B0), (E1, B1), ...]."""

    def __init__(self, points):
        self.points = sorted(points)
        if not self.points or self.points[0][0] != 0:
            raise UserError("a batch schedule must start at epoch 0, e.g. --batch-schedule 0:8192,30:16384")
        if any(batch <= 0 for _, batch in self.points):
            raise UserError(f"batch sizes must be positive in the batch schedule {self}")

    @classmethod
    def parse(cls, text, world_size=1):
        """"0:8192,30:16384" -> BatchSchedule([(0, 8192), (30, 16384)]); a batch written N/rank
        is N times `world_size`."""
        try:
            points = [cls._point(item, world_size) for item in text.split(",")]
        except ValueError:
            raise UserError(f"--batch-schedule {text!r} is not EPOCH:BATCH pairs (BATCH global, or N/rank per "
                            "rank): write e.g. 0:8192,30:16384 or 0:16/rank,30:32/rank") from None
        return cls(points)

    @staticmethod
    def _point(item, world_size):
        epoch, batch = item.split(":")
        per_rank = batch.endswith("/rank")
        batch = int(batch[:-len("/rank")] if per_rank else batch)
        return int(epoch), batch * world_size if per_rank else batch

    def __str__(self):
        return ",".join(f"{epoch}:{batch}" for epoch, batch in self.points)

    def global_batch(self, epoch):
        index = bisect.bisect_right([e for e, _ in self.points], epoch) - 1
        return self.points[index][1]

    def plan(self, epoch, world_size, max_per_rank_batch=None):
        """Per-rank batch and accumulation steps for `epoch`; the global batch must split evenly."""
        global_batch = self.global_batch(epoch)
        if global_batch % world_size:
            raise UserError(f"global batch {global_batch} (epoch {epoch}) does not split over {world_size} "
                            f"ranks: use a multiple of {world_size}")
        per_rank = global_batch // world_size
        accum = 1 if not max_per_rank_batch else ceil_div(per_rank, max_per_rank_batch)
        while per_rank % accum:  # the smallest number of equal micro-batches within the cap
            accum += 1
        return BatchPlan(global_batch, per_rank, accum, per_rank // accum)


@dataclasses.dataclass(frozen=True)
class LRSchedule:
    lr: float                 # the reference rate, for `base_batch` images
    base_batch: int
    batches: BatchSchedule
    epochs: int
    scheduler: str = "step"
    steps: tuple = (30, 60, 80)
    gamma: float = 0.1
    power: float = 2.0
    warmup_epochs: float = 0.0
    warmup_method: str = "linear"
    warmup_start: float | None = None  # None: the reference rate

    def target(self, t):
        """The linearly scaled rate for the global batch in use at fractional epoch t."""
        return self.lr * self.batches.global_batch(int(t)) / self.base_batch

    def __call__(self, t):
        """The learning rate at fractional epoch t = epoch + step / steps_in_epoch."""
        target = self.target(t)
        if t < self.warmup_epochs:
            start = self.lr if self.warmup_start is None else self.warmup_start
            if self.warmup_method == "constant":
                return start
            return start + (target - start) * t / self.warmup_epochs
        progress = min(1.0, (t - self.warmup_epochs) / max(self.epochs - self.warmup_epochs, 1e-12))
        if self.scheduler == "step":
            return target * self.gamma ** bisect.bisect_right(self.steps, int(t))
        if self.scheduler == "poly":
            return target * (1 - progress) ** self.power
        if self.scheduler == "cosine":
            return target * 0.5 * (1 + math.cos(math.pi * progress))
        return target


def epoch_table(lr_schedule, world_size, dataset_size, max_per_rank_batch=None):
    """One row per epoch: the batch layout, the rate at the epoch's first iteration, the
    number of optimizer steps (what `train.py --print-schedule` prints)."""
    rows = []
    for epoch in range(lr_schedule.epochs):
        plan = lr_schedule.batches.plan(epoch, world_size, max_per_rank_batch)
        rows.append({"epoch": epoch, "global_batch": plan.global_batch, "per_rank_batch": plan.per_rank_batch,
                     "accum_steps": plan.accum_steps, "lr": float(f"{lr_schedule(epoch):.12g}"),
                     "iterations": dataset_size // plan.global_batch})
    return rows
