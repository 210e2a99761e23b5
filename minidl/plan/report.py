"""What a plan prints and what `--json` writes: the run's layout, then per stretch of identical
epochs the iteration's parts for each algorithm side by side, then the whole run's time to
train, images/s and scaling efficiency against the same GPUs without communication.

Details: docs/plan.md, "Reading a plan".
"""
import itertools

MS = 1e3


def stretches(epochs):
    """Runs of consecutive epochs with the same layout: [(first, last, EpochTime of the first)]."""
    found = []
    for _, group in itertools.groupby(epochs, lambda e: (e.global_batch, e.per_gpu_batch, e.accum_steps, e.iterations)):
        group = list(group)
        found.append((group[0].epoch, group[-1].epoch, group[0]))
    return found


def text(about, runs):
    """The printed plan: `about` (the header's lines), then the table of `runs` (run.Run each)."""
    labels = [run.algorithm.label for run in runs]
    width = max(14, *(len(label) for label in labels)) + 2
    lines = list(about)

    def row(name, values, fmt):
        lines.append(f"  {name:<30}" + "".join(f"{fmt(v):>{width}}" for v in values))

    lines.append(" " * 32 + "".join(f"{label:>{width}}" for label in labels))
    for first, last, epoch in stretches(runs[0].epochs):
        span = f"epoch {first}" if first == last else f"epochs {first}-{last}"
        lines.append(f"{span}: global batch {epoch.global_batch:,} = {epoch.per_gpu_batch} per GPU"
                     + (f" in {epoch.accum_steps} micro-batches" if epoch.accum_steps > 1 else "")
                     + f", {epoch.iterations:,} iterations an epoch")
        its = [run.iterations[(epoch.per_gpu_batch, epoch.accum_steps)] for run in runs]
        row("forward ms", [it.forward for it in its], ms)
        row("backward ms", [it.backward for it in its], ms)
        row("exposed communication ms", [it.exposed for it in its], ms)
        row("optimizer update ms", [it.update for it in its], ms)
        if any(it.data for it in its):
            row("data wait ms", [it.data_wait for it in its], ms)
        row("iteration ms", [it.seconds for it in its], ms)
        row("all communication ms", [it.communication for it in its], ms)
        row("epoch s", [it.seconds * epoch.iterations for it in its], lambda v: f"{v:.1f}")
    lines.append("whole run:")
    row("time to train", [run.seconds for run in runs], duration)
    row("images/s", [run.images / run.seconds if run.seconds else 0 for run in runs], lambda v: f"{v:,.0f}")
    row("scaling efficiency", [run.efficiency for run in runs], lambda v: f"{v:.1%}")
    return "\n".join(lines)


def curve_text(curve, per_gpu_batch):
    """run.efficiency_curve's points as a table: a row per GPU count, a column per algorithm."""
    names = list(curve)
    lines = [f"scaling efficiency of one iteration at {per_gpu_batch} images per GPU:",
             f"  {'GPUs':>6}" + "".join(f"{name:>14}" for name in names)]
    for row in zip(*(curve[name] for name in names)):
        lines.append(f"  {row[0][0]:>6,}" + "".join(f"{efficiency:>14.1%}" for _, efficiency in row))
    return "\n".join(lines)


def ms(seconds):
    return f"{seconds * MS:.2f}"


def duration(seconds):
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def iteration_dict(layout, it):
    per_gpu_batch, accum = layout
    return {"per_gpu_batch": per_gpu_batch, "accum_steps": accum, "forward_ms": it.forward * MS,
            "backward_ms": it.backward * MS, "exposed_communication_ms": it.exposed * MS,
            "optimizer_update_ms": it.update * MS, "data_wait_ms": it.data_wait * MS, "iteration_ms": it.seconds * MS,
            "communication_ms": it.communication * MS, "compute_only_ms": it.compute_only * MS}


def timeline_dict(it):
    """One iteration's timeline: compute, each bucket's final moment and stages, the exposed tail."""
    return {"forward_ms": [0.0, it.forward * MS], "backward_ms": [it.forward * MS, it.backward_end * MS],
            "exposed_ms": [it.backward_end * MS, (it.backward_end + it.exposed) * MS],
            "bucket_final_ms": [t * MS for t in it.bucket_final],
            "stages": [{"bucket": s.bucket, "index": s.index, "group": s.group, "op": s.op, "ranks": s.ranks,
                        "bytes": s.nbytes, "issued_ms": s.issued * MS, "start_ms": s.start * MS, "end_ms": s.end * MS}
                       for s in it.stages]}


def run_dict(run):
    algorithm = run.algorithm
    return {"algorithm": algorithm.label, "grid": algorithm.grid.to_dict() if algorithm.grid else None,
            "buckets": [{"bytes": 4 * (b.stop - b.start), "parameters": len(b.parameters),
                         "stages": [{"group": s.group, "op": s.op, "ranks": s.ranks, "per_node": s.per_node,
                                     "bytes": s.nbytes} for s in b.stages]} for b in algorithm.exchange.buckets],
            "iterations": [iteration_dict(layout, it) for layout, it in sorted(run.iterations.items())],
            "epochs": [{"epoch": e.epoch, "global_batch": e.global_batch, "per_gpu_batch": e.per_gpu_batch,
                        "accum_steps": e.accum_steps, "iterations": e.iterations, "seconds": e.seconds}
                       for e in run.epochs],
            "seconds": run.seconds, "images": run.images,
            "images_per_second": run.images / run.seconds if run.seconds else None,
            "compute_only_seconds": run.compute_only_seconds, "scaling_efficiency": run.efficiency}
