"""One traced step of one rank: backward, module by module, against its gradient buckets, each
from the moment its gradients were final to the end of its all-reduce (its stages on top).

Drawn from a trace of `--trace-steps` (minidl.training.chrome_trace's events), the last step
every rank traced: what a bucket does while backward still runs is hidden; what is left after
backward's end is the all-reduce wait the step pays.
"""
from matplotlib.patches import Patch

from minidl.errors import UserError
from minidl.figures.style import new_figure
from minidl.plot_timeline import BUCKET_COLOR, PHASE_COLORS, STAGE_COLORS, from_trace, last_common_step
from minidl.training import chrome_trace

MODULE_COLORS = ("#55a868", "#8fc79b")  # consecutive backward modules alternate


def overlap_figure(path, rank=0):
    """The figure of `rank` in the trace file at `path` (a UserError where it is no trace or holds
    no whole step)."""
    return from_trace(path, lambda events: _figure(events, rank))


def _figure(events, rank):
    found = last_common_step(events)
    if found is None:
        raise UserError("the trace holds no step that every rank traced: trace at least one whole step")
    number, step_of = found
    step = step_of[rank]
    mine = [e for e in events if e["pid"] == rank and step["ts"] <= e["ts"] <= step["ts"] + step["dur"]]
    backward = [e for e in mine if e["cat"] == chrome_trace.BACKWARD]
    start = min(e["ts"] for e in backward)
    end_of_backward = max(e["ts"] + e["dur"] for e in backward)

    def span(event):
        return (event["ts"] - start) / 1e3, event["dur"] / 1e3

    buckets = sorted({e["tid"] for e in mine if e["cat"] == chrome_trace.BUCKET})
    figure, axes = new_figure(1, 1, (11, 1.6 + 0.45 * len(buckets)))
    axes.broken_barh([span(e) for e in backward[0::2]], (-0.4, 0.8), color=MODULE_COLORS[0])
    axes.broken_barh([span(e) for e in backward[1::2]], (-0.4, 0.8), color=MODULE_COLORS[1])
    labels = ["backward (modules)"]
    for y, tid in enumerate(buckets, start=1):
        for event in (e for e in mine if e["tid"] == tid):
            if event["cat"] == chrome_trace.BUCKET:
                axes.broken_barh([span(event)], (y - 0.4, 0.8), color=BUCKET_COLOR)
                labels.append(f"bucket {tid - 1}: {event['args']['parameters']}")
            elif event["cat"] == chrome_trace.STAGE:
                axes.broken_barh([span(event)], (y - 0.25, 0.5), color=STAGE_COLORS[event["args"]["op"]], zorder=2)
    wait = [e for e in mine if e["cat"] == chrome_trace.PHASE and e["name"] == "all-reduce wait"]
    for event in wait:
        axes.broken_barh([span(event)], (-0.4, 0.8), color=PHASE_COLORS["all-reduce wait"])
    axes.axvline((end_of_backward - start) / 1e3, color="black", linestyle="dashed", linewidth=0.8)
    axes.set_yticks(range(len(labels)), labels, fontsize=7)
    axes.invert_yaxis()
    axes.set_xlabel("ms from the start of backward")
    legend = {"backward": MODULE_COLORS[0], "all-reduce wait": PHASE_COLORS["all-reduce wait"],
              "bucket: gradients final → reduced": BUCKET_COLOR, **STAGE_COLORS}
    figure.legend(handles=[Patch(color=color, label=name) for name, color in legend.items()],
                  loc="outside lower center", ncols=len(legend), fontsize=7)
    axes.set_title(f"rank {rank}, step {number}: buckets reduced while backward runs; right of the dashed line "
                   "(end of backward) the step waits", fontsize=9)
    return figure
