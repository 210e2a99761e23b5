"""Learning-rate schedules, evaluated per iteration.

`LRSchedule(base_lr, iters_per_epoch, epochs, scheduler)` maps a global iteration to a rate:
- "cosine": base·(1 + cos(π·t/T))/2 over all T iterations, smooth per iteration;
- "step": base·γ^k where k counts the milestone epochs (`steps`) already passed;
- "constant": base throughout.
"""
import bisect
import math

LR_SCHEDULERS = ("cosine", "step", "constant")


class LRSchedule:
    def __init__(self, base_lr, iters_per_epoch, epochs, scheduler="cosine", steps=(30, 60, 80), gamma=0.1):
        if scheduler not in LR_SCHEDULERS:
            raise ValueError(f"unknown scheduler {scheduler!r}; choose one of {LR_SCHEDULERS}")
        self.base_lr, self.iters_per_epoch, self.epochs = base_lr, iters_per_epoch, epochs
        self.scheduler, self.steps, self.gamma = scheduler, tuple(steps), gamma

    def __call__(self, iteration):
        if self.scheduler == "cosine":
            progress = iteration / (self.iters_per_epoch * self.epochs)
            return self.base_lr * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        if self.scheduler == "step":
            epoch = iteration // self.iters_per_epoch
            return self.base_lr * self.gamma ** bisect.bisect_right(self.steps, epoch)
        return self.base_lr
