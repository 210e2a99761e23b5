"""A run stopped mid-epoch and resumed on another number of ranks (2 → 1, 2 → 4, 4 → 3).

Which images each rank reads is observed from outside the engine (tests/training/read_probe.py: a
Python audit hook logs every training image a process opens; the loader reads an image only
for the batch it is about to train on, with --workers 0). The probe also preempts the run: each
rank sends itself SIGTERM on the last image of iteration STOP_ITERATION (mid-epoch), so the run
checkpoints there.

Checked against an uninterrupted run on the old number of ranks, with its global batch:
- the stopped part read exactly the images of that run's first STOP_ITERATION steps;
- the resumed part's every step read that run's step's images (as a set: which rank takes
  which image differs), so across the interruption every image of the epoch was read once;
- the loss curve continues, within TOLERANCE. It is not the same bits: BN statistics are per
  rank, so another number of ranks normalizes each image with other images' statistics (and
  sums the gradients in another order); on the same ranks a resume is exact (test_resume.py).
"""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from minidl import models, nn
from minidl.checkpoint import load_checkpoint, training_state
from minidl.config import Config
from minidl.data import make_embedded_dataset
from minidl.errors import UserError
from minidl.optim import SGD
from minidl.training.position import EpochTotals
from minidl.training.state import RunState, adopt_checkpoint_batches
from mpi.launch import mpiexec, require_mpi
from test_resume import environment

REPO = Path(__file__).resolve().parents[2]
# 240 images: 10 steps of 24 per epoch; the run stops at step 4 of epoch 5 of 6, when the loss falls
GLOBAL_BATCH, STEPS, EPOCHS, STOP_ITERATION = 24, 10, 6, 44
# on each epoch's training loss (mean over its 240 images) and on the running mean over the
# interrupted epoch (steps.jsonl) after the resume; the loss falls from 2.33 to 2.10 over the run,
# the resumed runs measured within 0.022 of the uninterrupted one. Single steps (24 images) and
# the validation loss of this over-fitting model drift further apart (up to 0.11 and 0.24).
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_embedded_dataset(tmp_path_factory.mktemp("embedded") / "data", train_per_class=24, val_per_class=4)


def train(data, output_dir, ranks, *extra, stop_after=0):
    """train.py under the read probe, on `ranks` ranks, into `output_dir` (which the probe's logs share)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    flags = ["--data-path", data, "--model", "resnet8_w8", "--epochs", EPOCHS, "--batch-schedule", f"0:{GLOBAL_BATCH}",
             "--lr", 0.05, "--lr-base-batch", GLOBAL_BATCH, "--train-crop-size", 16, "--val-crop-size", 16,
             "--val-resize-size", 16, "--augment", "none", "--print-freq", 1, "--output-dir", output_dir, *extra]
    probe = [str(REPO / "tests" / "training" / "read_probe.py"), str(Path(data) / "train"), str(output_dir),
             str(stop_after), str(REPO / "train.py")]
    launcher = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py"] if ranks > 1 else [sys.executable]
    result = subprocess.run(launcher + probe + [str(flag) for flag in flags], capture_output=True, text=True,
                            timeout=300, env=environment())
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def reads(output_dir):
    """[the images rank r read, in order] for every rank r of the run in `output_dir`."""
    ranks = json.loads((output_dir / "ranks.json").read_text())
    return [(output_dir / f"reads-{entry['pid']}.txt").read_text().split() for entry in ranks]


def steps_read(per_rank, first_step, steps):
    """For each step, the set of images all ranks read in it (every rank reads its share, in order)."""
    share = GLOBAL_BATCH // len(per_rank)
    return [sorted(image for rank in per_rank for image in rank[(s - first_step) * share:(s - first_step + 1) * share])
            for s in range(first_step, first_step + steps)]


def losses(output_dir, name, key):
    return [json.loads(line)[key] for line in (output_dir / name).read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    """{ranks: the output directory of an uninterrupted run}, made on first use."""
    made = {}

    def run(ranks):
        if ranks not in made:
            made[ranks] = tmp_path_factory.mktemp(f"uninterrupted{ranks}")
            train(data, made[ranks], ranks)
        return made[ranks]
    return run


@pytest.mark.slow
@pytest.mark.parametrize("old, new, extra", [(2, 1, ()), (2, 4, ()), (4, 3, ("--torus-shape", "3x1"))])
def test_resumed_on_another_number_of_ranks_reads_the_rest_of_the_epoch_once(data, tmp_path, uninterrupted,
                                                                             old, new, extra):
    require_mpi()
    reference = uninterrupted(old)
    stopped, resumed = tmp_path / "stopped", tmp_path / "resumed"
    out = train(data, stopped, old, stop_after=STOP_ITERATION * GLOBAL_BATCH // old).stdout
    assert "stopped by SIGTERM" in out, out[-2000:]
    checkpoint = sorted(stopped.glob("checkpoint-e*-i*.h5"))[-1]  # the newest, the one the stop wrote
    before, meta = load_checkpoint(checkpoint)
    epoch, step = divmod(STOP_ITERATION, STEPS)
    assert (meta["world_size"], meta["epoch"], meta["step"]) == (old, epoch, step)
    train(data, resumed, new, "--resume", checkpoint, *extra)

    expected = steps_read(reads(reference), 0, EPOCHS * STEPS)
    before_stop = steps_read(reads(stopped), 0, STOP_ITERATION)
    after_stop = steps_read(reads(resumed), STOP_ITERATION, EPOCHS * STEPS - STOP_ITERATION)
    assert before_stop == expected[:STOP_ITERATION] and after_stop == expected[STOP_ITERATION:]
    every_image = sorted(f"{c.name}/{f.name}" for c in (Path(data) / "train").iterdir() for f in c.iterdir())
    interrupted_epoch = slice(epoch * STEPS, (epoch + 1) * STEPS)
    assert sorted(sum((before_stop + after_stop)[interrupted_epoch], [])) == every_image  # each image once

    step_loss = losses(stopped, "steps.jsonl", "loss") + losses(resumed, "steps.jsonl", "loss")
    reference_loss = losses(reference, "steps.jsonl", "loss")
    assert step_loss[:STOP_ITERATION] == reference_loss[:STOP_ITERATION]  # the same run up to the stop
    rest_of_epoch = slice(STOP_ITERATION, (epoch + 1) * STEPS)
    np.testing.assert_allclose(step_loss[rest_of_epoch], reference_loss[rest_of_epoch], atol=TOLERANCE, rtol=0)
    train_loss = losses(stopped, "metrics.jsonl", "train_loss") + losses(resumed, "metrics.jsonl", "train_loss")
    reference_train_loss = losses(reference, "metrics.jsonl", "train_loss")
    assert reference_train_loss[-1] < reference_train_loss[0] - 3 * TOLERANCE  # it falls: a lost state would show
    np.testing.assert_allclose(train_loss, reference_train_loss, atol=TOLERANCE, rtol=0)

    after, meta = load_checkpoint(sorted(resumed.glob("checkpoint-e*-i*.h5"))[-1])
    assert (meta["world_size"], meta["iteration"]) == (new, EPOCHS * STEPS)
    statistics = {name for name in after if name.startswith("rank")}
    assert statistics == {f"rank{r}/{name[len('buffers/'):]}" for r in range(new) for name in after
                          if name.startswith("buffers/")}
    if extra:  # a 3x1 grid pads the flat buffers to a multiple of 3072, the 2x2 one to 1024
        assert len(before["optimizer/params"]) % 3072 and not len(after["optimizer/params"]) % 3072


# --- what a new rank starts from, without launching ranks --------------------------------------

def checkpoint_of(world_size, statistics, totals):
    """(arrays, meta) as RunState.save writes them for `world_size` ranks: rank r's BN
    statistics all `statistics[r]`, its epoch sums `totals[r]`."""
    nn.manual_seed(0)
    model = models.resnet8_w8(num_classes=10)
    arrays, meta = training_state(model, SGD(model.parameters(), lr=0.1))
    for rank in range(world_size):
        arrays.update((f"rank{rank}/{name}", np.full(buffer.shape, statistics[rank], buffer.dtype))
                      for name, buffer in model.named_buffers())
    meta.update(model="resnet8_w8", epoch=2, step=3, iteration=23, world_size=world_size, batch_schedule="0:24",
                totals=[EpochTotals(*entry).to_dict() for entry in totals])
    return arrays, meta


def restored_on(rank, world_size, arrays, meta):
    """(BN statistics, epoch sums) that rank `rank` of `world_size` restores from the checkpoint."""
    nn.manual_seed(1)
    model = models.resnet8_w8(num_classes=10)
    comm = SimpleNamespace(rank=rank, size=world_size)
    state = RunState(SimpleNamespace(model="resnet8_w8"), comm, model, SGD(model.parameters(), lr=0.1), None, None)
    position, totals = state.restore("c.h5", arrays, meta)
    assert (position.epoch, position.step, position.iteration) == (2, 3, 23)
    return dict(model.named_buffers()), totals


def test_new_ranks_start_from_the_mean_statistics_and_rank_0_carries_the_epoch_sums():
    arrays, meta = checkpoint_of(2, [0.25, 0.75], [(1.5, 12, 1), (2.5, 12, 0)])
    for rank in range(3):
        buffers, totals = restored_on(rank, 3, arrays, meta)
        assert all((buffer == np.float32(0.5)).all() for buffer in buffers.values())
        assert totals == (EpochTotals(4.0, 24, 1) if rank == 0 else EpochTotals())
    for rank in range(2):  # on the same ranks, each its own
        buffers, totals = restored_on(rank, 2, arrays, meta)
        assert all((buffer == np.float32([0.25, 0.75][rank])).all() for buffer in buffers.values())
        assert totals == EpochTotals(*[(1.5, 12, 1), (2.5, 12, 0)][rank])


def test_equal_statistics_average_to_themselves_bit_for_bit():
    value = np.float32(0.1)  # 3 · 0.1 rounds in float32: the mean is taken in float64
    arrays, meta = checkpoint_of(3, [value] * 3, [(0.0, 0, 0)] * 3)
    buffers, _ = restored_on(0, 2, arrays, meta)
    assert all(buffer.tobytes() == np.full(buffer.shape, value).tobytes() for buffer in buffers.values())


@pytest.mark.parametrize("schedule, ranks, sizes", [("0:24", 5, "1, 2, 3, 4, 6, 8, 12 or 24 processes"),
                                                    ("0:8,3:12", 8, "1, 2 or 4 processes"),
                                                    ("0:7", 2, "with 1 or 7 processes")])
def test_a_global_batch_the_new_ranks_cannot_split_names_those_that_can(schedule, ranks, sizes):
    config = dataclasses.replace(Config(), batch_size=8)
    with pytest.raises(UserError) as caught:
        adopt_checkpoint_batches(config, {"batch_schedule": schedule}, ranks)
    message = str(caught.value)
    assert "\n" not in message and f"does not split over {ranks} ranks" in message and message.endswith(sizes)


def test_the_checkpoint_global_batch_replaces_the_per_rank_batch():
    config = adopt_checkpoint_batches(dataclasses.replace(Config(), batch_size=8), {"batch_schedule": "0:24"}, 3)
    assert (config.batch_size, config.batch_schedule) == (None, "0:24")
    assert config.batches(3).plan(0, 3).per_rank_batch == 8
