"""Part 1 under several BLAS kernels: each row's spread across seeds and across kernels apart, and B*
as a distribution over resamples of both.

A cell is one seed under one kernel with every batch of the sweep run. Across seeds: each kernel's
standard deviation over its seeds, pooled over kernels (the root of the mean variance). Across
kernels: each seed's standard deviation over the kernels that ran it, pooled over seeds; it is
what another kernel's rounding alone moves a result by. A resample of m seeds draws m seeds
with replacement and, for each draw, one of the kernels that ran that seed; the study's rule
(report.critical_batch) on the m cells gives that resample's B*.
"""
import dataclasses
import math
import statistics
from pathlib import Path

import numpy

from minidl.experiments.large_batch import report
from minidl.experiments.large_batch.rows import Row, batch_rows, config_for
from minidl.experiments.large_batch.runs import changed_settings, settings_of
from minidl.fileio import write_json_atomic


def part1_records(records, design):
    """{kernel: {(batch, seed): record}} of the store's records that are part 1 of `design`."""
    rows = {row.key: row for row in batch_rows(design)}
    found = {}
    for record in records:
        row = rows.get(record["row"])
        if row and not changed_settings(record["settings"],
                                        settings_of(config_for(row, record["seed"], design, ".", "."), design)):
            found.setdefault(record["kernel"], {})[row.batch, record["seed"]] = record
    return found


def cells(errors_by_kernel, batches):
    """{kernel: {seed: [error per batch, in `batches` order]}} of the seeds each kernel ran at every
    batch; `errors_by_kernel` {kernel: {(batch, seed): error}}."""
    return {kernel: {seed: [errors[batch, seed] for batch in batches]
                     for seed in sorted({seed for _, seed in errors})
                     if all((batch, seed) in errors for batch in batches)}
            for kernel, errors in errors_by_kernel.items()}


def pooled_std(groups):
    """The root of the mean sample variance of the groups of two or more values (nan if there are none)."""
    variances = [statistics.variance(group) for group in groups if len(group) > 1]
    return math.sqrt(statistics.mean(variances)) if variances else math.nan


@dataclasses.dataclass(frozen=True)
class RowSpread:
    batch: int
    mean: float          # over every cell
    across_seeds: float  # pooled over kernels
    across_kernels: float  # pooled over seeds
    cells: int


def row_spreads(table, batches):
    """One RowSpread per batch; `table` as `cells` gives it."""
    spreads = []
    for index, batch in enumerate(batches):
        by_kernel = {kernel: {seed: row[index] for seed, row in seeds.items()} for kernel, seeds in table.items()}
        values = [error for errors in by_kernel.values() for error in errors.values()]
        seeds = sorted({seed for errors in by_kernel.values() for seed in errors})
        spreads.append(RowSpread(
            batch, statistics.mean(values) if values else math.nan,
            pooled_std([list(errors.values()) for errors in by_kernel.values()]),
            pooled_std([[errors[seed] for errors in by_kernel.values() if seed in errors] for seed in seeds]),
            len(values)))
    return spreads


def b_star_distribution(table, batches, size, resamples=report.RESAMPLES, seed=0):
    """{batch: how often it is B*} over resamples of `size` seeds, each drawn with one of the kernels
    that ran it (report.b_star_resampled); `table` as `cells` gives it."""
    kernels = sorted(table)
    seeds = sorted({s for runs in table.values() for s in runs})
    errors = numpy.full((len(seeds), len(kernels), len(batches)), numpy.nan)
    for k, kernel in enumerate(kernels):
        for s, run_seed in enumerate(seeds):
            if run_seed in table[kernel]:
                errors[s, k] = table[kernel][run_seed]
    return report.b_star_resampled(errors, batches, size, resamples, seed)


def seed_counts(seeds):
    """The resample sizes to show for `seeds` distinct seeds: every even count from 4, and all of them."""
    return sorted({m for m in range(4, seeds + 1, 2)} | {seeds}) if seeds > 1 else []


def b_star_by_seed_count(table, batches):
    """{m: B*'s distribution over resamples of m seeds and their kernels}, m as seed_counts gives it."""
    seeds = len({s for runs in table.values() for s in runs})
    return {m: b_star_distribution(table, batches, m) for m in seed_counts(seeds)}


def spread_table(table, batches):
    kernels = sorted(table)
    lines = ["| k·n | cells | mean (%) | std across seeds | std across kernels | "
             + " | ".join(f"{kernel}: mean ± std (seeds)" for kernel in kernels) + " |",
             "|---|---|---|---|---|" + "---|" * len(kernels)]
    for index, spread in enumerate(row_spreads(table, batches)):
        per_kernel = []
        for kernel in kernels:
            errors = {seed: row[index] for seed, row in table[kernel].items()}
            if errors:
                values = list(errors.values())
                std = statistics.stdev(values) if len(values) > 1 else 0.0
                listed = ", ".join(f"{s}: {e:.2f}" for s, e in errors.items())
                per_kernel.append(f"{statistics.mean(values):.2f} ± {std:.2f} ({listed})")
            else:
                per_kernel.append("")
        lines.append(f"| {spread.batch} | {spread.cells} | {spread.mean:.2f} | {spread.across_seeds:.2f} | "
                     f"{spread.across_kernels:.2f} | " + " | ".join(per_kernel) + " |")
    return "\n".join(lines)


def pooled_b_star(table, batches):
    """The study's rule on every cell at once (mean and std over all seeds of all kernels)."""
    columns = list(zip(*[row for runs in table.values() for row in runs.values()]))
    return report.critical_batch([(batch, statistics.mean(column), statistics.stdev(column))
                                  for batch, column in zip(batches, columns)])


def compare_kernels(design, records, output_dir):
    """kernels.md, kernels.json and kernels.png in `output_dir` from the store's part-1 records of
    `design`; returns the markdown and the paths written (none while fewer than two seeds are complete)."""
    output_dir, batches = Path(output_dir), [row.batch for row in batch_rows(design)]
    found = part1_records(records, design)
    table = {kernel: runs for kernel, runs in cells({kernel: {key: record["val_error"] for key, record in runs.items()}
                                                     for kernel, runs in found.items()}, batches).items() if runs}
    if sum(len(runs) for runs in table.values()) < 2:
        return "Part 1 across kernels: fewer than two complete seeds in the store, nothing to compare yet.\n", []
    by_count = b_star_by_seed_count(table, batches)
    b_star = pooled_b_star(table, batches)
    wall = sum(record["wall_seconds"] for runs in found.values() for record in runs.values())
    text = "\n\n".join([
        f"Part 1 under {len(table)} BLAS kernels ({sum(map(len, table.values()))} complete sweeps of "
        f"{len({seed for runs in table.values() for seed in runs})} seeds; "
        f"{wall / 3600:.1f} h of training recorded); the rule on every seed of every kernel: B* = {b_star}",
        spread_table(table, batches),
        "B* over resamples of m seeds, each drawn with replacement and computed by one of the kernels that ran it:",
        report.distribution_table(by_count) if by_count else "(one seed: no resamples)"]) + "\n"
    (output_dir / "kernels.md").write_text(text)
    write_json_atomic(output_dir / "kernels.json", {
        "b_star": b_star, "errors": {kernel: {str(seed): row for seed, row in runs.items()}
                                     for kernel, runs in table.items()},
        "batches": batches, "spread": [dataclasses.asdict(spread) for spread in row_spreads(table, batches)],
        "b_star_by_seed_count": by_count, "wall_seconds": wall})
    views = {kernel: {Row(batch): [found[kernel][batch, seed] for seed in runs] for batch in batches}
             for kernel, runs in table.items()}
    figure = report.error_vs_batch_figure(output_dir / "kernels.png", views, b_star,
                                          title="Error vs global batch under each BLAS kernel")
    return text, [output_dir / "kernels.md", output_dir / "kernels.json", figure]
