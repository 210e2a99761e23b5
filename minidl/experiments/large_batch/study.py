"""The study in order: the batch sweep, B* from it, then the warmup and batch-size-control rows;
its outputs (results.json, table.md, figures); and the sweep that picks the reference rate."""
import dataclasses
from pathlib import Path

from tqdm import tqdm

from minidl.data import make_embedded_dataset
from minidl.experiments.large_batch import report
from minidl.experiments.large_batch.rows import N, Row, batch_rows, control_rows, warmup_rows
from minidl.experiments.large_batch.runs import run_once
from minidl.fileio import write_json_atomic


@dataclasses.dataclass
class Study:
    design: object
    results: dict  # Row -> [result per seed]
    batch_rows: list
    b_star: int = None
    warmup_rows: list = dataclasses.field(default_factory=list)
    control_rows: list = dataclasses.field(default_factory=list)


def dataset(design, cache_dir):
    return make_embedded_dataset(Path(cache_dir) / design.dataset_name, train_per_class=design.train_per_class,
                                 val_per_class=design.val_per_class, image_size=design.image_size,
                                 difficulty=design.difficulty)


def run_rows(rows, design, data, output_dir, results, bar, label=""):
    """Each row not yet in `results`, once per seed; one line per run trained now (`label` first)."""
    for row in dict.fromkeys(rows):
        if row in results:
            continue
        results[row] = []
        for seed in design.seeds:
            result = run_once(row, seed, design, data, output_dir)
            results[row].append(result)
            bar.update(1)
            if not result["cached"]:
                bar.write(f"{label}{row.name}, seed {seed}: val error {result['val_error']:.2f}%"
                          f"{' (diverged)' if result['diverged'] else ''}, {result['steps']} steps, "
                          f"{result['wall_seconds']:.0f} s")


def run_study(design, output_dir, cache_dir):
    data = dataset(design, cache_dir)
    study = Study(design, {}, batch_rows(design))
    seeds = len(design.seeds)
    with tqdm(total=len(study.batch_rows) * seeds, desc="large-batch study", unit="run", dynamic_ncols=True) as bar:
        run_rows(study.batch_rows, design, data, output_dir, study.results, bar)
        study.b_star = report.critical_batch([(row.batch, stats.mean, stats.std) for row in study.batch_rows
                                              for stats in [report.Stats.of(study.results[row])]])
        study.warmup_rows = warmup_rows(study.b_star)
        study.control_rows = control_rows(study.b_star, design)
        later = [row for row in dict.fromkeys(study.warmup_rows + study.control_rows) if row not in study.results]
        bar.total += len(later) * seeds
        bar.refresh()
        run_rows(later, design, data, output_dir, study.results, bar)
    return study


def markdown(study):
    design, results, b_star = study.design, study.results, study.b_star
    parts = [f"Part 1: error vs global batch (gradual warmup), η = {design.lr:g} per {N}; B* = {b_star}",
             report.batch_table(study.batch_rows, results, design),
             "Part 2: warmup at B* and 2·B*", report.table("row", study.warmup_rows, results, design),
             "Part 3: batch-size control and label smoothing",
             report.table("row", list(dict.fromkeys(study.control_rows)), results, design)]
    return "\n\n".join(parts) + "\n"


def write_outputs(study, output_dir):
    """results.json, table.md and the three figures; returns the paths."""
    output_dir, results, b_star = Path(output_dir), study.results, study.b_star
    rows = {row.key: {"name": row.name, "steps": row.steps(study.design), **dataclasses.asdict(report.Stats.of(runs)),
                      "runs": [{k: run[k] for k in ("seed", "val_error", "diverged", "wall_seconds")} for run in runs]}
            for row, runs in results.items()}
    write_json_atomic(output_dir / "results.json",
                      {"design": dataclasses.asdict(study.design), "b_star": b_star, "rows": rows,
                       "parts": {"batch": [r.key for r in study.batch_rows], "warmup": [r.key for r in study.warmup_rows],
                                 "control": [r.key for r in study.control_rows]},
                       "wall_seconds": sum(run["wall_seconds"] for runs in results.values() for run in runs)})
    (output_dir / "table.md").write_text(markdown(study))
    ref, fixed, control, largest, smoothed = study.control_rows
    small = Row(N)
    warmup_panels = [(f"warmup at k·n = {batch}", [small] + [row for row in study.warmup_rows if row.batch == batch])
                     for batch in (b_star, 2 * b_star)]
    control_panels = [(f"batch-size control: {control.name}", [small, ref, fixed, control]),
                      (f"label smoothing at k·n = {largest.batch}", [small, largest, smoothed])]
    return [output_dir / "results.json", output_dir / "table.md",
            report.error_vs_batch_figure(output_dir / "error-vs-batch.png", study.batch_rows, results, b_star),
            report.curves_figure(output_dir / "warmup.png", warmup_panels, results, "train_loss_curve",
                                 "training loss"),
            report.curves_figure(output_dir / "control.png", control_panels, results, "val_error_curve",
                                 "validation error (%)")]


def lr_sweep(design, rates, output_dir, cache_dir):
    """The small batch (k·n = n) at each reference rate; returns the markdown table and the best rate."""
    data = dataset(design, cache_dir)
    stats = {}
    with tqdm(total=len(rates) * len(design.seeds), desc="rate sweep", unit="run", dynamic_ncols=True) as bar:
        for rate in rates:
            at_rate = dataclasses.replace(design, lr=rate)
            results = {}
            run_rows([Row(N)], at_rate, data, Path(output_dir) / "lr-sweep" / f"lr{rate:g}", results, bar,
                     label=f"η = {rate:g}: ")
            stats[rate] = report.Stats.of(results[Row(N)])
    best = min(stats, key=lambda rate: stats[rate].mean)
    lines = [f"| η per {N} (k·n = {N}) | val error (%) |", "|---|---|"]
    lines += [f"| {rate:g}{' (lowest)' if rate == best else ''} | {stats[rate]} |" for rate in rates]
    text = "\n".join(lines) + "\n"
    (Path(output_dir) / "lr-sweep" / "table.md").write_text(text)
    return text, best
