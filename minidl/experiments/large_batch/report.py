"""The study's numbers and figures: mean ± std over seeds, the critical batch B* and its bootstrap
distribution, the difference of two rows in pooled standard deviations, tables, plots."""
import collections
import dataclasses
import itertools
import math
import statistics

import numpy

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from minidl.experiments.large_batch.rows import N
from minidl.plot import save


@dataclasses.dataclass(frozen=True)
class Stats:
    """A row's final validation error (%) over its seeds."""
    mean: float
    std: float
    errors: tuple
    diverged: tuple  # per seed: whether the run stopped on a non-finite loss

    @classmethod
    def of(cls, runs):
        errors = tuple(run["val_error"] for run in runs)
        return cls(statistics.mean(errors), statistics.stdev(errors) if len(errors) > 1 else 0.0, errors,
                   tuple(bool(run["diverged"]) for run in runs))

    def __str__(self):
        seeds = ", ".join(f"{e:.1f}" + ("†" if d else "") for e, d in zip(self.errors, self.diverged))
        return f"{self.mean:.2f} ± {self.std:.2f} ({seeds})"


def critical_batch(points):
    """B*: the largest batch up to which every batch's mean error is at most one standard
    deviation above the smallest batch's mean (a lucky mean past a batch that broke does not
    count). `points`: (batch, mean, std) tuples."""
    ordered = sorted(points)
    _, reference_mean, reference_std = ordered[0]
    within = itertools.takewhile(lambda point: point[1] <= reference_mean + reference_std, ordered)
    return list(within)[-1][0]


def points(view):
    """The (batch, mean, std) points of a view's rows, for critical_batch."""
    return [(row.batch, s.mean, s.std) for row, s in ((row, Stats.of(runs)) for row, runs in view.items())]


RESAMPLES = 2000


def b_star_distribution(errors, size, resamples=RESAMPLES, seed=0):
    """How often each batch is B* when the seeds are resampled: `errors` {batch: [error per seed]}, the
    same seeds in the same order for every batch; each resample draws `size` seed indices with
    replacement and uses them for every batch (a seed's runs stay together). {batch: fraction}."""
    batches = sorted(errors)
    table = numpy.array([errors[batch] for batch in batches]).T[:, None, :]  # seeds × one kernel × batches
    return b_star_resampled(table, batches, size, resamples, seed)


def b_star_resampled(errors, batches, size, resamples=RESAMPLES, seed=0):
    """B*'s distribution {batch: fraction} over resamples of seeds and kernels: `errors` an array seeds ×
    kernels × batches, nan where a kernel did not run a seed. Each resample draws `size` seeds with
    replacement, and for each drawn seed one of the kernels that ran it, uniformly; a seed's batches
    stay together. With one kernel this is the bootstrap over seeds alone."""
    ran = ~numpy.isnan(errors[:, :, 0])
    rng = numpy.random.default_rng(seed)
    seed_draws = rng.integers(0, errors.shape[0], size=(resamples, size))
    # a uniform choice among the kernels that ran the drawn seed: the largest of random scores where it ran
    scores = numpy.where(ran[seed_draws], rng.random((resamples, size, errors.shape[1])), -1.0)
    kernel_draws = scores.argmax(axis=2)
    counts = collections.Counter()
    for draw_seeds, draw_kernels in zip(seed_draws, kernel_draws):
        sample = errors[draw_seeds, draw_kernels].T  # batches × size
        std = sample.std(axis=1, ddof=1) if size > 1 else numpy.zeros(len(batches))
        counts[critical_batch(list(zip(batches, sample.mean(axis=1), std)))] += 1
    return {batch: counts[batch] / resamples for batch in batches}


def b_star_by_seed_count(view):
    """{m: B*'s distribution over resamples of m seeds} for m from 2 to the seeds run: how settled B*
    is with the seeds at hand, and how it would have scattered with fewer."""
    errors = {row.batch: [run["val_error"] for run in runs] for row, runs in view.items()}
    seeds = len(next(iter(errors.values())))
    return {size: b_star_distribution(errors, size) for size in range(2, seeds + 1)}


def distribution_table(by_count):
    batches = list(next(iter(by_count.values())))
    lines = ["| seeds per resample | " + " | ".join(f"P(B* = {b})" for b in batches) + " |",
             "|---|" + "---|" * len(batches)]
    lines += [f"| {m} | " + " | ".join(f"{p:.2f}" for p in dist.values()) + " |" for m, dist in by_count.items()]
    return "\n".join(lines)


def difference(base, other):
    """other − base in the rows' error (%), and in units of their pooled standard deviation."""
    delta = other.mean - base.mean
    pooled = math.sqrt((base.std ** 2 + other.std ** 2) / 2)
    return delta, delta / pooled if pooled else math.nan


def comparison_table(view, design):
    """Rows in pairs (without, with the knob): each pair's second row gets the difference."""
    rows = list(view)
    lines = ["| row | steps | val error (%) | difference | in pooled std |", "|---|---|---|---|---|"]
    for base, other in zip(rows[::2], rows[1::2]):
        a, b = Stats.of(view[base]), Stats.of(view[other])
        delta, effect = difference(a, b)
        lines += [f"| {base.name} | {base.steps(design)} | {a} | | |",
                  f"| {other.name} | {other.steps(design)} | {b} | {delta:+.2f} | {effect:+.2f} |"]
    return "\n".join(lines)


def table(title, view, design):
    """`view`: {row: [result per seed]}, as every function here takes them."""
    lines = [f"| {title} | steps | val error (%) |", "|---|---|---|"]
    lines += [f"| {row.name} | {row.steps(design)} | {Stats.of(runs)} |" for row, runs in view.items()]
    return "\n".join(lines)


def batch_table(view, design):
    lines = ["| k·n | k | steps | rate k·η | val error (%) |", "|---|---|---|---|---|"]
    lines += [f"| {row.batch} | {row.batch // N} | {row.steps(design)} | {design.lr * row.batch / N:g} | "
              f"{Stats.of(runs)} |" for row, runs in view.items()]
    return "\n".join(lines)


def mean_curve(runs, key):
    """The per-epoch mean over seeds of a curve, up to the last epoch every seed reached (the
    mean of the runs left after one diverged would look better than the row is)."""
    shortest = min(len(run[key]) for run in runs)
    return [statistics.mean(run[key][e] for run in runs) for e in range(shortest)]


def curves_axes(axes, rows, view, key, title, ylabel):
    for row in dict.fromkeys(rows):
        curve = mean_curve(view[row], key)
        axes.plot(range(1, len(curve) + 1), curve, marker="o", markersize=3, label=row.name)
    axes.set(title=title, xlabel="epoch", ylabel=ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)


def error_vs_batch_figure(path, series, b_star, title="Error vs global batch, same epochs"):
    """`series`: {label: view}, each drawn as mean ± std per batch with its seeds as dots; the first
    series' smallest batch gives the reference band."""
    figure = Figure(figsize=(6.5, 4), layout="constrained")
    axes = figure.subplots()
    (first, *_), batches = series.values(), set()
    reference = Stats.of(first[min(first, key=lambda row: row.batch)])
    axes.axhspan(reference.mean - reference.std, reference.mean + reference.std, color="gray", alpha=0.2,
                 label=f"k·n = {N}: mean ± std")
    for (label, view), colour in zip(series.items(), ("tab:blue", "tab:orange", "tab:green", "tab:purple")):
        ordered = sorted(view, key=lambda row: row.batch)
        stats = [Stats.of(view[row]) for row in ordered]
        batches.update(row.batch for row in ordered)
        for row, s in zip(ordered, stats):
            axes.scatter([row.batch] * len(s.errors), s.errors, color=colour, alpha=0.35, s=12)
        axes.errorbar([row.batch for row in ordered], [s.mean for s in stats], yerr=[s.std for s in stats],
                      marker="o", capsize=3, color=colour, label=f"{label}: mean ± std over seeds (dots: seeds)")
    axes.axvline(b_star, color="tab:red", linestyle="--", label=f"B* = {b_star}")
    axes.set_xscale("log", base=2)
    axes.set_xticks(sorted(batches), [str(b) for b in sorted(batches)])
    axes.set(xlabel="global batch k·n (n = 32 per worker, linear scaling, gradual warmup)",
             ylabel="final validation error (%)", title=title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    return save(figure, path)


def curves_figure(path, panels, view, key, ylabel):
    """Side-by-side panels, `panels` as (title, rows): the curve `key` per epoch, mean over seeds."""
    figure = Figure(figsize=(11, 4), layout="constrained")
    for axes, (title, rows) in zip(figure.subplots(1, len(panels), sharey=True), panels):
        curves_axes(axes, rows, view, key, title, ylabel)
        axes.set_yscale("log")
        for axis_formatter in (axes.yaxis.set_major_formatter, axes.yaxis.set_minor_formatter):
            axis_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    return save(figure, path)
