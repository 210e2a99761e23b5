"""The study in order: the batch sweep, B* from it (with its bootstrap distribution), then the
warmup, batch-size-control and LARS rows, the label-smoothing part on noisy labels with its own
sweep, and LARS under You et al.'s protocol; its outputs (results.json, table.md, figures); and the
sweeps that pick the rates."""
import dataclasses
import time
from pathlib import Path

from tqdm import tqdm

from minidl.data import make_embedded_dataset
from minidl.experiments.large_batch import protocol, report
from minidl.experiments.large_batch.rows import (DEFAULT_PARTS, N, Row, batch_rows, control_rows, lars_rows,
                                                 protocol_tuning_rows, smoothing_rows, warmup_rows)
from minidl.experiments.large_batch.runs import Busy, run_once
from minidl.fileio import write_json_atomic

NOISY_FOLDER = "label-noise"  # part 5's runs, under the output folder: other data, so other run folders
BUSY_POLL_SECONDS = 5  # how often a run another process trains is looked for


@dataclasses.dataclass
class Sweep:
    """Error vs batch on one design: its results, its batch rows over `seeds`, and B*."""
    design: object
    seeds: tuple
    results: dict  # (Row, seed) -> result
    b_star: int = None

    @property
    def rows(self):
        return batch_rows(self.design)

    def view(self, rows=None, seeds=None):
        """{row: [result per seed]}: `rows` over `seeds` (the sweep's own by default)."""
        seeds = seeds or self.seeds
        return {row: [self.results[row, seed] for seed in seeds] for row in dict.fromkeys(rows or self.rows)}

    def run(self, data, output_dir, bar, store=None):
        """Train what is missing of the sweep, seed by seed (a stopped sweep leaves whole seeds, each a
        sample of every batch); B* from it."""
        pairs = sorted(missing(self.rows, self.seeds, self.results), key=lambda pair: self.seeds.index(pair[1]))
        bar.total += len(pairs)
        bar.refresh()
        run_all(pairs, self.design, data, output_dir, self.results, bar, store=store)
        self.b_star = report.critical_batch(report.points(self.view()))


@dataclasses.dataclass
class Study:
    design: object
    sweep: Sweep        # part 1
    noisy: Sweep        # part 5's sweep, on the noisy design
    warmup_rows: list = dataclasses.field(default_factory=list)
    control_rows: list = dataclasses.field(default_factory=list)
    lars_rows: list = dataclasses.field(default_factory=list)
    smoothing_rows: list = dataclasses.field(default_factory=list)
    protocol_rates: dict = dataclasses.field(default_factory=dict)  # part 6: {(batch, optimizer): tuned rate}
    selected: tuple = DEFAULT_PARTS

    @property
    def b_star(self):
        return self.sweep.b_star

    def lars_b_star(self):
        """B* by the study's rule when the batches past B* train with LARS (SGD up to B*)."""
        up_to = [row for row in self.sweep.rows if row.batch <= self.b_star]
        view = {**self.sweep.view(up_to), **self.sweep.view([row for row in self.lars_rows if row.opt == "lars"],
                                                             self.design.seeds)}
        return report.critical_batch(report.points(view))

    def parts(self):
        """[(key, title, view)] of the selected parts in the order of the study; the first is the batch sweep."""
        design, noisy, seeds, selected = self.design, self.noisy.design, self.design.seeds, self.selected
        parts = [("batch", f"Part 1: error vs global batch (gradual warmup), η = {design.lr:g} per {N}; "
                           f"B* = {self.b_star}", self.sweep.view())]
        if 2 in selected:
            parts.append(("warmup", "Part 2: warmup at B* and 2·B*", self.sweep.view(self.warmup_rows, seeds)))
        if 3 in selected:
            parts.append(("control", "Part 3: batch-size control and label smoothing",
                          self.sweep.view(self.control_rows, seeds)))
        if 4 in selected:
            parts.append(("lars", f"Part 4: LARS (η = {design.lars_lr:g} per {N}, trust coefficient 0.001) against "
                                  f"SGD past B*; B* with LARS = {self.lars_b_star()}",
                          self.sweep.view(self.lars_rows, seeds)))
        if 5 in selected:
            parts += [("noisy-batch", f"Part 5a: error vs global batch with {noisy.label_noise:.0%} of training "
                                      f"labels flipped, {noisy.train_per_class} images per class, η = {noisy.lr:g} "
                                      f"per {N}; B* = {self.noisy.b_star}", self.noisy.view()),
                      ("smoothing", "Part 5b: label smoothing at B* and 2·B* of the noisy data",
                       self.noisy.view(self.smoothing_rows, design.ls_seeds))]
        if 6 in selected:
            parts.append(("lars-protocol", f"Part 6: LARS against SGD under You et al.'s protocol (gradual warmup, "
                                           f"then poly decay, power 2, to zero; each rate tuned on seed "
                                           f"{design.tuning_seed}) at 2, 4 and 8 × {design.protocol_b_star}",
                          self.protocol_view()))
        return parts

    def protocol_view(self):
        """Part 6's reported rows over the seeds."""
        return self.sweep.view(protocol.reported_rows(self.design, self.protocol_rates), self.design.seeds)


def dataset(design, cache_dir):
    return make_embedded_dataset(Path(cache_dir) / design.dataset_name, train_per_class=design.train_per_class,
                                 val_per_class=design.val_per_class, image_size=design.image_size,
                                 difficulty=design.difficulty, label_noise=design.label_noise)


def missing(rows, seeds, results):
    return [(row, seed) for row in dict.fromkeys(rows) for seed in seeds if (row, seed) not in results]


def run_all(pairs, design, data, output_dir, results, bar, label="", store=None):
    """Each (row, seed) into `results` (from `store` where it holds them); one line per run trained now
    (`label` first). Runs another process is training are left for last, then waited for (or trained
    here, should that process stop)."""
    def take(row, seed):
        result = results[row, seed] = run_once(row, seed, design, data, output_dir, store)
        bar.update(1)
        if not result["cached"]:
            bar.write(f"{label}{row.name}, seed {seed}: val error {result['val_error']:.2f}%"
                      f"{' (diverged)' if result['diverged'] else ''}, {result['steps']} steps, "
                      f"{result['wall_seconds']:.0f} s")

    busy = []
    for row, seed in pairs:
        try:
            take(row, seed)
        except Busy:
            busy.append((row, seed))
    for row, seed in busy:
        while True:
            try:
                take(row, seed)
                break
            except Busy:
                time.sleep(BUSY_POLL_SECONDS)


def run_study(design, output_dir, cache_dir, selected=DEFAULT_PARTS, store=None):
    """Part 1, then those of parts 2-6 in `selected` (runs found in `store`, a Store or None, are not trained)."""
    output_dir = Path(output_dir)
    study = Study(design, Sweep(design, design.batch_seeds, {}), Sweep(design.noisy(), design.seeds, {}),
                  selected=selected)
    with tqdm(total=0, desc="large-batch study", unit="run", dynamic_ncols=True) as bar:
        data = dataset(design, cache_dir)
        study.sweep.run(data, output_dir, bar, store)
        b_star = study.b_star
        study.warmup_rows = warmup_rows(b_star) if 2 in selected else []
        study.control_rows = control_rows(b_star, design) if 3 in selected else []
        study.lars_rows = lars_rows(b_star) if 4 in selected else []
        later = missing(study.warmup_rows + study.control_rows + study.lars_rows, design.seeds, study.sweep.results)
        bar.total += len(later)
        run_all(later, design, data, output_dir, study.sweep.results, bar, store=store)
        if 5 in selected:
            noisy_data, noisy_dir = dataset(study.noisy.design, cache_dir), output_dir / NOISY_FOLDER
            study.noisy.run(noisy_data, noisy_dir, bar, store)
            study.smoothing_rows = smoothing_rows(study.noisy.b_star, design)
            later = missing(study.smoothing_rows, design.ls_seeds, study.noisy.results)
            bar.total += len(later)
            run_all(later, study.noisy.design, noisy_data, noisy_dir, study.noisy.results, bar, store=store)
        if 6 in selected:
            def train(pairs):
                bar.total += len(pairs)
                run_all(pairs, design, data, output_dir, study.sweep.results, bar, store=store)
            study.protocol_rates = protocol.run(design, study.sweep.results, train)
    return study


def markdown(study):
    (_, batch_title, batch_view), *others = study.parts()
    design = study.design
    parts = [batch_title, report.batch_table(batch_view, design), "B* over bootstrap resamples of the seeds "
             "(m of them per resample, drawn with replacement, the same seeds for every batch):",
             report.distribution_table(report.b_star_by_seed_count(batch_view))]
    for key, title, view in others:
        sweep = study.noisy if key in ("noisy-batch", "smoothing") else study.sweep
        if key == "noisy-batch":
            parts += [title, report.batch_table(view, sweep.design), report.distribution_table(
                report.b_star_by_seed_count(view))]
        elif key == "smoothing":
            parts += [title, report.comparison_table(view, sweep.design)]
        elif key == "lars-protocol":
            parts += [title, protocol.tuning_table(design, study.sweep.results), report.table("row", view, design),
                      protocol.verdict(protocol.b_stars(view)) + "."]
        else:
            parts += [title, report.table("row", view, sweep.design)]
    return "\n\n".join(parts) + "\n"


def write_outputs(study, output_dir):
    """results.json, table.md and the selected parts' figures; returns the paths."""
    output_dir, design, b_star = Path(output_dir), study.design, study.b_star
    parts = {}
    for key, title, view in study.parts():
        row_design = study.noisy.design if key in ("noisy-batch", "smoothing") else design
        parts[key] = {"title": title, "rows": {
            row.key: {"name": row.name, "steps": row.steps(row_design), **dataclasses.asdict(report.Stats.of(runs)),
                      "runs": [{k: run[k] for k in ("seed", "val_error", "diverged", "wall_seconds")} for run in runs]}
            for row, runs in view.items()}}
    summary = {"design": dataclasses.asdict(design), "parts_run": list(study.selected), "b_star": b_star,
               "b_star_by_seed_count": report.b_star_by_seed_count(study.sweep.view())}
    if 4 in study.selected:
        summary["lars_b_star"] = study.lars_b_star()
    if 5 in study.selected:
        summary.update(noisy_b_star=study.noisy.b_star,
                       noisy_b_star_by_seed_count=report.b_star_by_seed_count(study.noisy.view()))
    if 6 in study.selected:
        b_stars = protocol.b_stars(study.protocol_view())
        summary["lars_protocol"] = {
            "best_rates": {f"b{batch}-{opt}": rate for (batch, opt), rate in study.protocol_rates.items()},
            "tuning_errors": {row.key: study.sweep.results[row, design.tuning_seed]["val_error"]
                              for row in protocol_tuning_rows(design)},
            "b_star": b_stars, "verdict": protocol.verdict(b_stars)}
    results = list(study.sweep.results.values()) + list(study.noisy.results.values())
    write_json_atomic(output_dir / "results.json",
                      dict(summary, parts=parts, wall_seconds=sum(run["wall_seconds"] for run in results)))
    (output_dir / "table.md").write_text(markdown(study))
    figures = [report.error_vs_batch_figure(output_dir / "error-vs-batch.png", {"SGD": study.sweep.view()}, b_star)]
    small = Row(N)
    if 2 in study.selected:
        warmup = study.sweep.view(study.warmup_rows, design.seeds)
        panels = [(f"warmup at k·n = {batch}", [small] + [row for row in warmup if row.batch == batch])
                  for batch in (b_star, 2 * b_star)]
        figures.append(report.curves_figure(output_dir / "warmup.png", panels, warmup, "train_loss_curve",
                                            "training loss"))
    if 3 in study.selected:
        ref, fixed, control, largest, smoothed = study.control_rows
        panels = [(f"batch-size control: {control.name}", [small, ref, fixed, control]),
                  (f"label smoothing at k·n = {largest.batch}", [small, largest, smoothed])]
        figures.append(report.curves_figure(output_dir / "control.png", panels,
                                            study.sweep.view(study.control_rows + [small], design.seeds),
                                            "val_error_curve", "validation error (%)"))
    if 4 in study.selected:
        by_opt = {opt: study.sweep.view([row for row in study.lars_rows if row.opt == opt], design.seeds)
                  for opt in ("sgd", "lars")}
        figures.append(report.error_vs_batch_figure(output_dir / "lars.png",
                                                    {"SGD": {**study.sweep.view(), **by_opt["sgd"]},
                                                     "LARS": by_opt["lars"]},
                                                    b_star, title="LARS against SGD past B*, same epochs"))
    if 6 in study.selected:
        view = study.protocol_view()
        series = {protocol.OPTIMIZER_NAMES[opt]: rows for opt, rows in protocol.by_optimizer(view).items()}
        figures.append(report.error_vs_batch_figure(output_dir / "lars-protocol.png", series, design.protocol_b_star,
                                                    title="LARS against SGD under You et al.'s protocol"))
    return [output_dir / "results.json", output_dir / "table.md", *figures]


TUNED = {"sgd": "lr", "lars": "lars_lr", "label-noise": "ls_lr"}  # --tune: the Design field each sweep picks


def tuning(design, target, rate, batch=N):
    """The design and the row (k·n = `batch`) that tune `target`'s rate, at `rate`."""
    if target == "label-noise":
        return design.noisy() if rate is None else dataclasses.replace(design.noisy(), lr=rate), Row(batch)
    tuned = design if rate is None else dataclasses.replace(design, **{TUNED[target]: rate})
    return tuned, Row(batch, opt="lars" if target == "lars" else "sgd")


def lr_sweep(design, rates, output_dir, cache_dir, target="sgd", batch=N, store=None):
    """`batch` (k·n) at each reference rate of `target` (one of TUNED); returns the markdown table and
    the best rate."""
    data = dataset(tuning(design, target, None)[0], cache_dir)
    sweep_dir = Path(output_dir) / "lr-sweep"
    name = ("" if target == "sgd" else f"{target}-") + ("" if batch == N else f"b{batch}-")
    stats, results = {}, {}
    with tqdm(total=len(rates) * len(design.seeds), desc="rate sweep", unit="run", dynamic_ncols=True) as bar:
        for rate in rates:
            tuned, row = tuning(design, target, rate, batch)
            run_all(missing([row], design.seeds, results), tuned, data, sweep_dir / f"{name}lr{rate:g}", results, bar,
                    label=f"η = {rate:g}: ", store=store)
            stats[rate] = report.Stats.of([results.pop((row, seed)) for seed in design.seeds])
    best = min(stats, key=lambda rate: stats[rate].mean)
    lines = [f"| η per {N} (k·n = {batch}, {target}) | val error (%) |", "|---|---|"]
    lines += [f"| {rate:g}{' (lowest)' if rate == best else ''} | {stats[rate]} |" for rate in rates]
    text = "\n".join(lines) + "\n"
    sweep_dir.mkdir(parents=True, exist_ok=True)  # no run folder is made where the store held every run
    (sweep_dir / f"{name}table.md").write_text(text)
    return text, best
