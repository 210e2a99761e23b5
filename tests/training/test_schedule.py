"""Batch-size control and learning-rate schedules against values computed by hand from the papers."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from minidl.errors import UserError
from minidl.schedule import BatchSchedule, LRSchedule

REPO = Path(__file__).resolve().parents[2]


def goyal(**overrides):
    """Goyal et al.'s 8k run: 256 workers × 32, 0.1 per 256, 5-epoch warmup from 0.1, ÷10 at 30/60/80."""
    settings = dict(lr=0.1, base_batch=256, batches=BatchSchedule([(0, 8192)]), epochs=90, scheduler="step",
                    steps=(30, 60, 80), gamma=0.1, warmup_epochs=5, warmup_method="linear", warmup_start=0.1)
    settings.update(overrides)
    return LRSchedule(**settings)


@pytest.mark.parametrize("t, expected", [
    (0.0, 0.1), (1.0, 0.1 + 3.1 / 5), (2.5, 0.1 + 3.1 / 2), (4.999, 0.1 + 3.1 * 4.999 / 5),
    (5.0, 3.2), (29.99, 3.2), (30.0, 0.32), (59.5, 0.32), (60.0, 0.032), (80.0, 0.0032), (89.9, 0.0032),
])
def test_goyal_linear_scaling_gradual_warmup_and_steps(t, expected):
    assert goyal()(t) == pytest.approx(expected, rel=1e-12)


def test_constant_warmup_holds_the_start_then_jumps():
    schedule = goyal(warmup_method="constant")
    assert [schedule(t) for t in (0, 2.5, 4.99)] == pytest.approx([0.1] * 3)
    assert schedule(5.0) == pytest.approx(3.2)


def test_warmup_start_defaults_to_the_reference_rate():
    schedule = goyal(warmup_start=None, lr=0.05)
    assert schedule(0) == pytest.approx(0.05)
    assert schedule(5) == pytest.approx(0.05 * 8192 / 256)


def test_no_warmup_starts_at_the_scaled_rate():
    assert goyal(warmup_epochs=0)(0) == pytest.approx(3.2)


@pytest.mark.parametrize("t", [5.0, 20.0, 47.5, 89.0])
def test_poly_and_cosine_decay_after_warmup(t):
    progress = (t - 5) / 85
    assert goyal(scheduler="poly", power=2.0)(t) == pytest.approx(3.2 * (1 - progress) ** 2)
    assert goyal(scheduler="cosine")(t) == pytest.approx(3.2 * 0.5 * (1 + math.cos(math.pi * progress)))


def test_the_rate_follows_the_batch_at_each_change():
    schedule = goyal(batches=BatchSchedule([(0, 8192), (10, 16384)]), scheduler="constant")
    assert schedule(9.99) == pytest.approx(3.2)
    assert schedule(10.0) == pytest.approx(6.4)


def test_batch_schedule_parsing_and_lookup():
    schedule = BatchSchedule.parse("0:256,5:512,30:1024")
    assert [schedule.global_batch(e) for e in (0, 4, 5, 29, 30, 89)] == [256, 256, 512, 512, 1024, 1024]
    assert str(schedule) == "0:256,5:512,30:1024"
    for bad in ("256", "0:256,x:512", "5:256", "0:0", "0:256:3"):
        with pytest.raises(UserError):
            BatchSchedule.parse(bad)


@pytest.mark.parametrize("global_batch, world, cap, per_rank, accum, micro", [
    (1024, 4, None, 256, 1, 256),
    (1024, 4, 64, 256, 4, 64),
    (1024, 4, 100, 256, 4, 64),   # 3 micro-batches would not be equal: the next divisor
    (96, 1, 64, 96, 2, 48),
    (34816, 2176, 16, 16, 1, 16),
    (69632, 2176, 16, 32, 2, 16),
])
def test_plan_splits_the_global_batch_over_ranks_and_micro_batches(global_batch, world, cap, per_rank, accum, micro):
    plan = BatchSchedule([(0, global_batch)]).plan(0, world, cap)
    assert (plan.global_batch, plan.per_rank_batch, plan.accum_steps, plan.micro_batch) == \
        (global_batch, per_rank, accum, micro)
    assert plan.micro_batch * plan.accum_steps * world == global_batch


def test_plan_refuses_a_batch_that_does_not_split_over_ranks():
    with pytest.raises(UserError, match="does not split over 3 ranks"):
        BatchSchedule([(0, 1000)]).plan(0, 3)


def print_schedule(*args):
    result = subprocess.run([sys.executable, str(REPO / "train.py"), "--print-schedule", *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.slow
def test_print_schedule_goyal_example():
    rows = print_schedule("--recipe", "goyal", "--world-size", "256", "--dataset-size", "1281167")
    assert len(rows) == 90
    assert {row["global_batch"] for row in rows} == {8192}
    assert {(row["per_rank_batch"], row["accum_steps"]) for row in rows} == {(32, 1)}
    assert rows[0]["lr"] == pytest.approx(0.1)
    assert rows[5]["lr"] == pytest.approx(3.2)
    assert rows[30]["lr"] == pytest.approx(0.32)
    assert rows[0]["iterations"] == 1281167 // 8192
    assert set(rows[0]) >= {"epoch", "global_batch", "per_rank_batch", "accum_steps", "lr"}


@pytest.mark.slow
def test_print_schedule_batch_control_with_a_cap():
    rows = print_schedule("--batch-schedule", "0:512,2:1024", "--max-per-rank-batch", "128", "--world-size", "2",
                          "--dataset-size", "10000", "--epochs", "4", "--lr", "0.1", "--lr-scheduler", "constant")
    assert [(r["global_batch"], r["per_rank_batch"], r["accum_steps"]) for r in rows] == \
        [(512, 256, 2), (512, 256, 2), (1024, 512, 4), (1024, 512, 4)]
    assert [r["lr"] for r in rows] == pytest.approx([0.2, 0.2, 0.4, 0.4])


@pytest.mark.slow
def test_a_per_rank_batch_schedule_scales_with_the_world():
    schedule = BatchSchedule.parse("0:16/rank,30:32/rank", world_size=2176)
    assert [schedule.global_batch(e) for e in (0, 29, 30)] == [34816, 34816, 69632]
    assert str(schedule) == "0:34816,30:69632"  # what a checkpoint keeps: the global batches
    assert BatchSchedule.parse("0:256,5:2/rank", world_size=128).points == [(0, 256), (5, 256)]
    for bad in ("0:16/ranks", "0:/rank", "0:16/rank:2"):
        with pytest.raises(UserError, match="N/rank per rank"):
            BatchSchedule.parse(bad, world_size=8)


@pytest.mark.parametrize("recipe, world, batches, peak_lr", [
    ("sony", 2176, {0: 34816, 29: 34816, 30: 69632, 89: 69632}, 0.1 * 34816 / 256),  # the 224-second run
    ("sony", 1088, {0: 17408, 30: 34816}, 0.1 * 17408 / 256),                      # the same preset on half the GPUs
    ("sony", 3456, {0: 55296, 30: 110592}, 0.1 * 55296 / 256),
    ("sony122", 3456, {0: 55296, 89: 55296}, 0.1 * 55296 / 256),                   # the 122-second run
])
@pytest.mark.slow
def test_print_schedule_of_the_sony_presets(recipe, world, batches, peak_lr):
    rows = print_schedule("--recipe", recipe, "--world-size", str(world), "--dataset-size", "1281167")
    assert len(rows) == 90
    assert {e: rows[e]["global_batch"] for e in batches} == batches
    assert {row["per_rank_batch"] for row in rows} <= {16, 32} and {row["accum_steps"] for row in rows} == {1}
    assert rows[0]["lr"] == pytest.approx(0.1)              # warmup from the reference rate
    assert rows[5]["lr"] == pytest.approx(peak_lr, rel=1e-3)  # the scaled rate when the 5-epoch warmup ends
    assert rows[89]["lr"] < rows[5]["lr"] / 100              # poly decay towards 0
