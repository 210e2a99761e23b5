"""The study's numbers and figures: mean ± std over seeds, the critical batch B*, tables, plots."""
import dataclasses
import itertools
import statistics

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


def error_vs_batch_figure(path, view, b_star):
    figure = Figure(figsize=(6.5, 4), layout="constrained")
    axes = figure.subplots()
    stats = [Stats.of(runs) for runs in view.values()]
    batches = [row.batch for row in view]
    reference = stats[0]
    axes.axhspan(reference.mean - reference.std, reference.mean + reference.std, color="gray", alpha=0.2,
                 label=f"k·n = {batches[0]}: mean ± std")
    for batch, s in zip(batches, stats):
        axes.scatter([batch] * len(s.errors), s.errors, color="tab:blue", alpha=0.35, s=12)
    axes.errorbar(batches, [s.mean for s in stats], yerr=[s.std for s in stats], marker="o", capsize=3,
                  color="tab:blue", label="mean ± std over seeds (dots: seeds)")
    axes.axvline(b_star, color="tab:red", linestyle="--", label=f"B* = {b_star}")
    axes.set_xscale("log", base=2)
    axes.set_xticks(batches, [str(b) for b in batches])
    axes.set(xlabel="global batch k·n (n = 32 per worker, linear scaling, gradual warmup)",
             ylabel="final validation error (%)", title="Error vs global batch, same epochs")
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
