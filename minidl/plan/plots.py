"""A plan's two figures (`--plot DIR`): efficiency.png, the scaling efficiency against the number of
GPUs for each all-reduce algorithm, and timeline.png, one iteration at the planned scale: the
compute lane, a lane per bucket with its stages coloured by operation, a dashed line where
backward ends and the exposed tail the step waits for.

Details: docs/plan.md, "Figures".
"""
import io

from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import ScalarFormatter

from minidl.fileio import write_bytes_atomic
from minidl.plot_timeline import PHASE_COLORS, STAGE_COLORS

EXPOSED_COLOR = "#c44e52"


def save(figure, path):
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=100)
    write_bytes_atomic(path, image.getvalue())
    return path


def efficiency_figure(curve, title):
    """`curve`: {algorithm: [(GPUs, efficiency)]}."""
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.add_subplot()
    for name, points in curve.items():
        gpus, efficiency = zip(*points)
        axes.plot(gpus, [100 * e for e in efficiency], marker="o", label=name)
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_formatter(ScalarFormatter())
    axes.set_xlabel("GPUs")
    axes.set_ylabel("scaling efficiency (%)")
    axes.set_ylim(0, 105)
    axes.grid(alpha=0.3)
    axes.legend()
    axes.set_title(f"{title}: one iteration against the same GPUs without communication", fontsize=9)
    return figure


def timeline_figure(it, title):
    """One iteration.Iteration: compute on top, a lane per bucket below (bucket 0, launched first, on top)."""
    buckets = len(it.bucket_final)
    figure = Figure(figsize=(10, 1.5 + 0.35 * buckets), layout="constrained")
    axes = figure.add_subplot()
    ms = 1e3
    axes.broken_barh([(0, it.forward * ms)], (-0.4, 0.8), color=PHASE_COLORS["forward"])
    axes.broken_barh([(it.forward * ms, it.backward * ms)], (-0.4, 0.8), color=PHASE_COLORS["backward"])
    if it.exposed:
        axes.broken_barh([(it.backward_end * ms, it.exposed * ms)], (-0.4, 0.8), color=EXPOSED_COLOR)
    axes.broken_barh([((it.backward_end + it.exposed) * ms, it.update * ms)], (-0.4, 0.8),
                     color=PHASE_COLORS["optimizer update"])
    for stage in it.stages:
        axes.broken_barh([(stage.start * ms, (stage.end - stage.start) * ms)], (stage.bucket + 0.6, 0.8),
                         color=STAGE_COLORS[stage.op])
    for k, final in enumerate(it.bucket_final):
        axes.plot([final * ms], [k + 1], marker="|", color="black", markersize=12)
    axes.axvline(it.backward_end * ms, color="black", linestyle="--", linewidth=1)
    axes.set_yticks(range(buckets + 1), ["compute"] + [f"bucket {k}" for k in range(buckets)])
    axes.invert_yaxis()
    axes.set_xlabel("ms from the iteration's start (| : the bucket's gradients are final; dashed: backward ends)")
    handles = [Patch(color=PHASE_COLORS["forward"], label="forward"),
               Patch(color=PHASE_COLORS["backward"], label="backward"),
               Patch(color=EXPOSED_COLOR, label="exposed communication"),
               Patch(color=PHASE_COLORS["optimizer update"], label="update"),
               *(Patch(color=color, label=op) for op, color in STAGE_COLORS.items())]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    axes.set_title(title, fontsize=9)
    return figure
