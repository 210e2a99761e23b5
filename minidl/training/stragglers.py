"""Which rank holds the others up: the spread of per-rank compute time, step by step.

Every rank's compute seconds and exposed wait for the reduction ride on the step's one
collective decision (Trainer.any_rank), so this costs no message of its own. Rank 0 keeps
them: `report()` (steps.jsonl) and `epoch_report()` (metrics.jsonl) give the fastest, median
and slowest compute, each rank's own, the slowest rank and what it cost the others; the
epoch's also names a `straggler`, a rank at least SLOWER times the median of the OTHER ranks
in more than half of the epoch's steps.

Details: docs/training.md, "minidl/training/stragglers.py".
"""
import numpy

SLOWER = 1.2


class Steps:
    """The per-rank times of the steps since the last report."""

    def __init__(self):
        self.compute, self.wait = [], []

    def report(self, epoch):
        compute, wait = numpy.array(self.compute), numpy.array(self.wait)
        if not len(compute):
            return {}
        steps, size = compute.shape
        slowest = compute.max(axis=1)
        counts = numpy.bincount(compute.argmax(axis=1), minlength=size)
        record = {"compute_fastest": compute.min(axis=1).mean(), "compute_median": numpy.median(compute, axis=1).mean(),
                  "compute_slowest": slowest.mean(), "rank_compute": compute.mean(axis=0).tolist(),
                  "rank_wait": wait.mean(axis=0).tolist(), "slowest_rank": int(counts.argmax()),
                  "slowest_share": counts.max() / steps,
                  "straggler_wait": ((size * slowest - compute.sum(axis=1)) / (size - 1)).mean()}
        if epoch:
            share = (compute >= SLOWER * median_of_others(compute)).mean(axis=0)
            record.update(straggler=int(share.argmax()) if share.max() > 0.5 else None, straggler_share=share.max())
        return {name: float(value) if isinstance(value, numpy.floating) else value for name, value in record.items()}


def median_of_others(compute):
    """[step, rank]: the median of the other ranks' values in the step, from one sort per step
    (removing rank r's value from the sorted row shifts the elements after its place by one)."""
    order = numpy.argsort(compute, axis=1, kind="stable")
    ordered = numpy.take_along_axis(compute, order, axis=1)
    place = numpy.argsort(order, axis=1)  # each rank's index in its step's sorted row
    others = compute.shape[1] - 1

    def of_others(i):  # the others' i-th smallest, for every (step, rank)
        return numpy.take_along_axis(ordered, numpy.where(i < place, i, i + 1), axis=1)

    return of_others(others // 2) if others % 2 else (of_others(others // 2 - 1) + of_others(others // 2)) / 2


class Stragglers:
    def __init__(self):
        self.recent, self.epoch = Steps(), Steps()

    def add(self, rows):
        """One step's (compute, wait) seconds of every rank, one row per rank."""
        for steps in (self.recent, self.epoch):
            steps.compute.append(rows[:, 0])
            steps.wait.append(rows[:, 1])

    def report(self):
        """The steps since the last report (and start a new window); {} when there were none."""
        report, self.recent = self.recent.report(epoch=False), Steps()
        return report

    def epoch_report(self):
        """The steps since the last epoch report, with the epoch's straggler."""
        report, self.epoch = self.epoch.report(epoch=True), Steps()
        return report
