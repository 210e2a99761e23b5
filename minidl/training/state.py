"""The run's state as a checkpoint: assembled over every rank, and restored from one.

A checkpoint holds the model's and optimizer's training state (minidl.checkpoint), every
rank's BN statistics (they are per rank), every rank's epoch totals, the position, the rate,
the global batch schedule and the configuration. Data order and augmentation are functions of
(seed, epoch, index), so there is no other random state to save.
"""
import dataclasses
from pathlib import Path

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
        same_world = meta["world_size"] == self.comm.size
        if meta["step"] and not same_world:
            raise UserError(f"checkpoint {path} was taken mid-epoch by {meta['world_size']} ranks, whose split "
                            f"of the epoch {self.comm.size} ranks cannot continue: resume with "
                            f"{meta['world_size']} processes, or from a checkpoint taken at an epoch's end")
        restore_training_state(path, arrays, meta, self.model, self.optimizer)
        rank = self.comm.rank if same_world else 0  # at an epoch's end the ranks' statistics agree
        for name, buffer in self.model.named_buffers():
            buffer[...] = xp.asarray(arrays[f"rank{rank}/{name}"])
        totals = EpochTotals(**meta["totals"][rank]) if same_world else EpochTotals()
        return Position(meta["epoch"], meta["step"], meta["iteration"]), totals


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
