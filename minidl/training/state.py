"""The run's state as a checkpoint: assembled over every rank, and restored from one.

It holds the model's and optimizer's state, every rank's BN statistics and epoch totals, the
position, rate, global batch schedule and configuration; data order and augmentation are
functions of (seed, epoch, index), so no other random state is saved. A run may resume on
another number of ranks, mid-epoch included, reading exactly the images left.

Details: docs/training.md, "minidl/training/state.py".
"""
import dataclasses
import math
from pathlib import Path

import numpy

from minidl.backend import to_numpy, xp
from minidl.checkpoint import CheckpointDir, check_compatible, load_checkpoint, restore_training_state, training_state
from minidl.errors import UserError
from minidl.training.position import EpochTotals, Position


class RunState:
    def __init__(self, config, comm, model, optimizer, schedule, checkpoints):
        self.config, self.comm, self.model, self.optimizer = config, comm, model, optimizer
        self.schedule, self.checkpoints = schedule, checkpoints

    def arrays_and_meta(self, position, totals):
        """(arrays, meta) of the whole run at `position`. Collective: every rank calls."""
        arrays, meta = training_state(self.model, self.optimizer)
        ranks = self.comm.allgather_object({"totals": totals.to_dict(), "buffers": {
            name: to_numpy(array) for name, array in self.model.named_buffers()}})
        for rank, entry in enumerate(ranks):  # BN statistics are per rank
            arrays.update((f"rank{rank}/{name}", array) for name, array in entry["buffers"].items())
        meta.update(model=self.config.model, config=self.config.to_dict(), epoch=position.epoch, step=position.step,
                    iteration=position.iteration, world_size=self.comm.size, lr=self.optimizer.lr,
                    batch_schedule=str(self.schedule.batches), totals=[entry["totals"] for entry in ranks])
        return arrays, meta

    def save(self, position, totals, diagnostic=False):
        """Write a checkpoint (rank 0; collective) and return its path (None on other ranks)."""
        arrays, meta = self.arrays_and_meta(position, totals)
        if self.comm.rank != 0:
            return None
        if diagnostic:
            return self.checkpoints.save_diagnostic(arrays, meta, position.iteration)
        return self.checkpoints.save(arrays, meta, position.epoch, position.iteration)

    def restore(self, path, arrays, meta):
        """Put a checkpoint's state into the model and optimizer; returns (Position, EpochTotals)."""
        check_compatible(path, meta, self.config.model, self.model.num_parameters())
        restore_training_state(path, arrays, meta, self.model, self.optimizer)
        old_ranks = range(meta["world_size"])
        for name, buffer in self.model.named_buffers():
            if meta["world_size"] == self.comm.size:
                buffer[...] = xp.asarray(arrays[f"rank{self.comm.rank}/{name}"])
            else:  # float64 sums: the mean of equal statistics is each of them, bit for bit
                mean = numpy.mean([arrays[f"rank{rank}/{name}"] for rank in old_ranks], axis=0, dtype=numpy.float64)
                buffer[...] = xp.asarray(mean.astype(buffer.dtype))
        return Position(meta["epoch"], meta["step"], meta["iteration"]), self._totals(meta["totals"])

    def _totals(self, saved):
        """This rank's share of the epoch's running sums: its own on the same ranks, else all on rank 0."""
        if len(saved) == self.comm.size:
            return EpochTotals(**saved[self.comm.rank])
        if self.comm.rank != 0:
            return EpochTotals()
        return EpochTotals(**{key: sum(entry[key] for entry in saved) for key in saved[0]})


def find_resume_point(config):
    """(path, arrays, meta) to resume from, or None for a fresh start."""
    if config.resume is None:
        return None
    if config.resume == "auto":
        return CheckpointDir(config.output_dir, config.keep_checkpoints).load_latest()
    return (Path(config.resume), *load_checkpoint(config.resume))


def adopt_checkpoint_batches(config, meta, world_size):
    """A resumed run keeps its global batch: the checkpoint's schedule replaces -b. UserError,
    naming the numbers of ranks that can, where `world_size` ranks cannot split it."""
    config = dataclasses.replace(config, batch_size=None, batch_schedule=meta["batch_schedule"])
    batches = config.batches(world_size)
    common = math.gcd(*(batch for _, batch in batches.points))
    if common % world_size:
        *some, last = [str(n) for n in range(1, common + 1) if common % n == 0]
        sizes = f"{', '.join(some)} or {last}" if some else last
        raise UserError(f"the checkpoint's global batch (epoch:batch {batches}, kept on resume) does not split "
                        f"over {world_size} ranks: resume with {sizes} process{'es' if some else ''}")
    return config
