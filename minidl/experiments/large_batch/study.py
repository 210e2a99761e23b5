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
    results: dict  # (Row, seed) -> result
    batch_rows: list
    b_star: int = None
    warmup_rows: list = dataclasses.field(default_factory=list)
    control_rows: list = dataclasses.field(default_factory=list)

    def view(self, rows, seeds):
        """{row: [result per seed]} of a part: its rows over its seeds."""
        return {row: [self.results[row, seed] for seed in seeds] for row in dict.fromkeys(rows)}

    def parts(self):
        """[(key, title, rows, seeds)] in the order of the study."""
        design = self.design
        return [("batch", f"Part 1: error vs global batch (gradual warmup), η = {design.lr:g} per {N}; "
                          f"B* = {self.b_star}", self.batch_rows, design.batch_seeds),
                ("warmup", "Part 2: warmup at B* and 2·B*", self.warmup_rows, design.seeds),
                ("control", "Part 3: batch-size control and label smoothing", self.control_rows, design.seeds)]


def dataset(design, cache_dir):
    return make_embedded_dataset(Path(cache_dir) / design.dataset_name, train_per_class=design.train_per_class,
                                 val_per_class=design.val_per_class, image_size=design.image_size,
                                 difficulty=design.difficulty)


def missing(rows, seeds, results):
    return [(row, seed) for row in dict.fromkeys(rows) for seed in seeds if (row, seed) not in results]


def run_all(pairs, design, data, output_dir, results, bar, label=""):
    """Each (row, seed) into `results`; one line per run trained now (`label` first)."""
    for row, seed in pairs:
        result = results[row, seed] = run_once(row, seed, design, data, output_dir)
        bar.update(1)
        if not result["cached"]:
            bar.write(f"{label}{row.name}, seed {seed}: val error {result['val_error']:.2f}%"
                      f"{' (diverged)' if result['diverged'] else ''}, {result['steps']} steps, "
                      f"{result['wall_seconds']:.0f} s")


def run_study(design, output_dir, cache_dir):
    data = dataset(design, cache_dir)
    study = Study(design, {}, batch_rows(design))
    first = missing(study.batch_rows, design.batch_seeds, study.results)
    with tqdm(total=len(first), desc="large-batch study", unit="run", dynamic_ncols=True) as bar:
        run_all(first, design, data, output_dir, study.results, bar)
        stats = {row.batch: report.Stats.of(runs) for row, runs in study.view(study.batch_rows, design.batch_seeds).items()}
        study.b_star = report.critical_batch([(batch, s.mean, s.std) for batch, s in stats.items()])
        study.warmup_rows = warmup_rows(study.b_star)
        study.control_rows = control_rows(study.b_star, design)
        later = missing(study.warmup_rows + study.control_rows, design.seeds, study.results)
        bar.total += len(later)
        bar.refresh()
        run_all(later, design, data, output_dir, study.results, bar)
    return study


def markdown(study):
    design = study.design
    (_, batch_title, batch_rows_, batch_seeds), *others = study.parts()
    parts = [batch_title, report.batch_table(study.view(batch_rows_, batch_seeds), design)]
    for _, title, rows, seeds in others:
        parts += [title, report.table("row", study.view(rows, seeds), design)]
    return "\n\n".join(parts) + "\n"


def write_outputs(study, output_dir):
    """results.json, table.md and the three figures; returns the paths."""
    output_dir, design, b_star = Path(output_dir), study.design, study.b_star
    parts = {}
    for key, title, rows, seeds in study.parts():
        parts[key] = {"title": title, "rows": {
            row.key: {"name": row.name, "steps": row.steps(design), **dataclasses.asdict(report.Stats.of(runs)),
                      "runs": [{k: run[k] for k in ("seed", "val_error", "diverged", "wall_seconds")} for run in runs]}
            for row, runs in study.view(rows, seeds).items()}}
    write_json_atomic(output_dir / "results.json",
                      {"design": dataclasses.asdict(design), "b_star": b_star, "parts": parts,
                       "wall_seconds": sum(run["wall_seconds"] for run in study.results.values())})
    (output_dir / "table.md").write_text(markdown(study))
    ref, fixed, control, largest, smoothed = study.control_rows
    small = Row(N)
    warmup = study.view(study.warmup_rows, design.seeds)
    warmup_panels = [(f"warmup at k·n = {batch}", [small] + [row for row in warmup if row.batch == batch])
                     for batch in (b_star, 2 * b_star)]
    control_panels = [(f"batch-size control: {control.name}", [small, ref, fixed, control]),
                      (f"label smoothing at k·n = {largest.batch}", [small, largest, smoothed])]
    return [output_dir / "results.json", output_dir / "table.md",
            report.error_vs_batch_figure(output_dir / "error-vs-batch.png",
                                         study.view(study.batch_rows, design.batch_seeds), b_star),
            report.curves_figure(output_dir / "warmup.png", warmup_panels, warmup, "train_loss_curve",
                                 "training loss"),
            report.curves_figure(output_dir / "control.png", control_panels,
                                 study.view(study.control_rows + [small], design.seeds), "val_error_curve",
                                 "validation error (%)")]


def lr_sweep(design, rates, output_dir, cache_dir):
    """The small batch (k·n = n) at each reference rate; returns the markdown table and the best rate."""
    data = dataset(design, cache_dir)
    stats, results = {}, {}
    with tqdm(total=len(rates) * len(design.seeds), desc="rate sweep", unit="run", dynamic_ncols=True) as bar:
        for rate in rates:
            run_all(missing([Row(N)], design.seeds, results), dataclasses.replace(design, lr=rate), data,
                    Path(output_dir) / "lr-sweep" / f"lr{rate:g}", results, bar, label=f"η = {rate:g}: ")
            stats[rate] = report.Stats.of([results.pop((Row(N), seed)) for seed in design.seeds])
    best = min(stats, key=lambda rate: stats[rate].mean)
    lines = [f"| η per {N} (k·n = {N}) | val error (%) |", "|---|---|"]
    lines += [f"| {rate:g}{' (lowest)' if rate == best else ''} | {stats[rate]} |" for rate in rates]
    text = "\n".join(lines) + "\n"
    (Path(output_dir) / "lr-sweep" / "table.md").write_text(text)
    return text, best
