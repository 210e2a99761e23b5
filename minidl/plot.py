"""Draw a training run's curves to PNG files:  python -m minidl.plot OUTDIR

Reads OUTDIR/metrics.jsonl and, if present, OUTDIR/steps.jsonl and OUTDIR/trace.json
(--trace-steps); for a step or epoch logged twice (a resumed run) the last line wins.
Writes into OUTDIR loss.png, top1.png, lr.png, global_batch.png, throughput.png and, when
their data is there, time_split.png, rank_step_time.png and timeline.png; a figure with
nothing to draw is not written. Prints the paths it wrote; bad input gives one line on stderr
and exit code 2.

Details: docs/training.md, "minidl/plot.py".
"""
import io
import json
import sys
from numbers import Real
from pathlib import Path

from matplotlib.figure import Figure  # the object API needs no display and no pyplot state

from minidl.errors import UserError
from minidl.fileio import write_bytes_atomic
from minidl.plot_timeline import draw_trace
from minidl.training.timer import PHASES

TIME_SPLITS = PHASES  # what steps.jsonl splits each step into

# file name, y label, [(source, key, legend, scale)]
FIGURES = [
    ("loss.png", "loss", [("metrics", "train_loss", "train, epoch mean", 1), ("metrics", "val_loss", "validation", 1),
                          ("steps", "loss", "train, every --print-freq steps", 1)]),
    ("top1.png", "validation accuracy (%)", [("metrics", "val_top1", "top-1", 100),
                                             ("metrics", "val_top5", "top-5", 100)]),
    ("lr.png", "learning rate", [("steps", "lr", "every --print-freq steps", 1),
                                 ("metrics", "lr", "end of epoch", 1)]),
    ("global_batch.png", "global batch (images)", [("steps", "global_batch", "every --print-freq steps", 1),
                                                   ("metrics", "global_batch", "per epoch", 1)]),
    ("throughput.png", "images / s", [("metrics", "images_per_sec", "epoch mean", 1),
                                      ("steps", "img_per_s", "every --print-freq steps", 1)]),
]


def is_number(value):
    return isinstance(value, Real) and not isinstance(value, bool)


def read_jsonl(path, key):
    """The JSON objects of `path` sorted by their numeric `key`, the last line for each value."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read {path} ({error}): point minidl.plot at a training run's --output-dir")
    rows = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(f"{path} line {number} is not JSON ({error.msg}): fix or delete that line")
        if not isinstance(row, dict) or not is_number(row.get(key)):
            raise UserError(f"{path} line {number} is not a JSON object with a numeric {key!r}: "
                            "fix or delete that line")
        rows[row[key]] = row
    return [rows[k] for k in sorted(rows)]


def series(rows, key, scale=1):
    """(epochs, values) of the rows that have a number under `key`."""
    points = [(row["epoch"], scale * row[key]) for row in rows if is_number(row.get(key))]
    return [x for x, _ in points], [y for _, y in points]


def save(figure, path):
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=100)
    write_bytes_atomic(path, image.getvalue())
    return path


def new_axes(ylabel, xlabel="epoch"):
    figure = Figure(figsize=(7, 4), layout="constrained")
    axes = figure.subplots()
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    return figure, axes


def line_figure(path, ylabel, lines, sources):
    """A figure of the given lines, or None when none of them has a point."""
    figure, axes = new_axes(ylabel)
    drawn = 0
    for source, key, legend, scale in lines:
        xs, ys = series(sources[source], key, scale)
        if xs:
            # steps are dense and noisy: a thin line under the per-epoch points
            style = dict(linewidth=0.8, alpha=0.7) if source == "steps" else dict(marker="o", markersize=3)
            axes.plot(xs, ys, label=legend, **style)
            drawn += 1
    if not drawn:
        return None
    axes.legend()
    return save(figure, path)


def time_split_figure(path, steps):
    """Stacked seconds per step by phase, for the phases steps.jsonl reports."""
    phases = [p for p in TIME_SPLITS if any(is_number(row.get(p)) for row in steps)]
    rows = [row for row in steps if all(is_number(row.get(p)) for p in phases)]
    if not phases or not rows:
        return None
    figure, axes = new_axes("seconds per step")
    axes.stackplot([row["epoch"] for row in rows], *[[row[p] for row in rows] for p in phases], labels=phases)
    figure.legend(loc="outside right upper")  # beside the stack, never over it
    return save(figure, path)


def rank_series(steps):
    """[(steps, compute milliseconds)] of each rank, from the rows that carry every rank's time."""
    rows = [row for row in steps if isinstance(row.get("rank_compute"), list)
            and all(is_number(seconds) for seconds in row["rank_compute"])]
    ranks = min((len(row["rank_compute"]) for row in rows), default=0)
    return [([row["iteration"] for row in rows], [1e3 * row["rank_compute"][rank] for row in rows])
            for rank in range(ranks)]


def rank_time_figure(path, steps):
    """Each rank's compute milliseconds per step (data, forward, backward) against steps."""
    series_of_ranks = rank_series(steps)
    if len(series_of_ranks) < 2:
        return None
    figure, axes = new_axes("compute per step (ms): data, forward, backward", xlabel="step")
    for rank, (xs, ys) in enumerate(series_of_ranks):
        axes.plot(xs, ys, label=f"rank {rank}", linewidth=0.8)
    figure.legend(loc="outside right upper")
    return save(figure, path)


def plot_run(output_dir):
    """Draw the figures of a run directory; returns the paths written."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise UserError(f"{output_dir} is not a directory: pass a training run's --output-dir")
    metrics_path, steps_path = output_dir / "metrics.jsonl", output_dir / "steps.jsonl"
    if not metrics_path.is_file():
        raise UserError(f"{output_dir} has no metrics.jsonl: pass a training run's --output-dir, "
                        "after its first epoch has finished")
    metrics = read_jsonl(metrics_path, "epoch")
    if not metrics:
        raise UserError(f"{metrics_path} has no epochs yet: plot after the first epoch has finished")
    steps = read_jsonl(steps_path, "iteration") if steps_path.is_file() else []
    steps = [row for row in steps if is_number(row.get("epoch"))]
    sources = {"metrics": metrics, "steps": steps}
    trace_path = output_dir / "trace.json"
    timeline = draw_trace(trace_path) if trace_path.is_file() else None  # bad input before any file is written
    written = [line_figure(output_dir / name, ylabel, lines, sources) for name, ylabel, lines in FIGURES]
    written.append(time_split_figure(output_dir / "time_split.png", steps))
    written.append(rank_time_figure(output_dir / "rank_step_time.png", steps))
    written.append(save(timeline, output_dir / "timeline.png") if timeline else None)
    return [path for path in written if path is not None]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(argv) != 1:
        print("usage: python -m minidl.plot OUTDIR (a training run's --output-dir)", file=sys.stderr)
        return 2
    try:
        paths = plot_run(argv[0])
    except UserError as error:
        print(f"minidl.plot: error: {error}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
