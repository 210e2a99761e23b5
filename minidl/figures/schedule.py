"""The sony recipe's global batch and learning rate over its 90 epochs, per iteration, on the
2,176 GPUs of Mikami et al.'s 224-second run: batch-size control (the batch doubles at epoch
30), the linear scaling rule and gradual warmup, then polynomial decay.

The schedule is the engine's own: `--recipe sony` resolved by minidl.config for an ImageNet run,
built by the trainer's `build_schedule` (minidl.schedule's BatchSchedule and LRSchedule).
"""
import numpy

from minidl.config import Config
from minidl.figures.style import new_figure
from minidl.training.build import build_schedule

RECIPE, GPUS = "sony", 2176
IMAGENET_TRAIN_IMAGES = 1_281_167


def schedule_figure(recipe=RECIPE, gpus=GPUS):
    config = Config(recipe=recipe).resolved(imagenet=True)
    schedule = build_schedule(config, gpus)
    epochs, batch, rate = [], [], []
    for epoch in range(schedule.epochs):
        iterations = IMAGENET_TRAIN_IMAGES // schedule.batches.global_batch(epoch)
        for t in epoch + numpy.arange(iterations) / iterations:  # the fractional epoch of each iteration
            epochs.append(t)
            batch.append(schedule.batches.global_batch(int(t)))
            rate.append(schedule(t))
    figure, (top, bottom) = new_figure(2, 1, (8, 5.5))
    top.plot(epochs, batch, color="#4c72b0")
    top.set_ylabel("global batch (images)")
    top.set_ylim(0, max(batch) * 1.1)
    bottom.plot(epochs, rate, color="#c44e52")
    bottom.set_ylabel("learning rate")
    bottom.set_xlabel(f"epoch (one point per iteration: {len(epochs):,} iterations)")
    for axes in (top, bottom):
        axes.grid(alpha=0.3)
        axes.set_xlim(0, schedule.epochs)
    top.set_title(f"--recipe {recipe} on {gpus:,} GPUs: --batch-schedule {config.batch_schedule}, "
                  f"lr {config.lr} per {config.lr_base_batch} images scaled linearly,\n"
                  f"warmup from {config.lr_warmup_start} over {config.lr_warmup_epochs:g} epochs, "
                  f"{config.lr_scheduler} decay (power {config.lr_power:g})", fontsize=9)
    return figure
