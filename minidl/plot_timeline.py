"""The timeline of one traced step (timeline.png, drawn by `python -m minidl.plot OUTDIR` from
OUTDIR/trace.json, a --trace-steps trace; minidl.training.chrome_trace describes it).

The last step that every rank traced, a row per rank: its compute lane shows the step's phases
(data wait, forward, backward, all-reduce wait, optimizer update); below it one lane per
gradient bucket shows the bucket's span, from the moment its gradients were final to its
completion (light), and the stages of its all-reduce on top, coloured by operation. A dashed
line marks where the rank's backward ended: what lies left of it was hidden behind backward,
what lies right of it the step waited for. Times in ms on rank 0's clock.
"""
import json

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from minidl.errors import UserError
from minidl.training import chrome_trace

PHASE_COLORS = {"data wait": "#bbbbbb", "forward": "#4c72b0", "backward": "#55a868", "all-reduce wait": "#c44e52",
                "optimizer update": "#8172b2"}
STAGE_COLORS = {"reduce_scatter": "#dd8452", "allreduce": "#937860", "allgather": "#da8bc3"}
BUCKET_COLOR = "#f0e0c8"


def draw_trace(path):
    """The figure of the trace file at `path` (None: it has no step); a UserError where the file
    is no trace written by --trace-steps."""
    return from_trace(path, timeline_figure)


def from_trace(path, draw):
    """draw(the complete ("X") events of the trace file at `path`); a UserError where the file
    is no trace written by --trace-steps."""
    try:
        return draw([e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise UserError(f"{path} is not a trace written by --trace-steps ({type(error).__name__}: {error}): "
                        "delete it or trace again")


def last_common_step(events):
    """(step number, {rank: the step's event}) of the last step every rank traced, or None."""
    steps = {}
    for event in events:
        if event.get("cat") == chrome_trace.STEP:
            steps.setdefault(event["args"]["step"], {})[event["pid"]] = event
    ranks = {event["pid"] for event in events}
    complete = [number for number, by_rank in steps.items() if set(by_rank) == ranks]
    return (max(complete), steps[max(complete)]) if complete else None


def timeline_figure(events):
    """The figure of the trace's `events`; None when no step is in the trace."""
    found = last_common_step(events)
    if found is None:
        return None
    number, step_of = found
    zero = min(event["ts"] for event in step_of.values())

    def bar(event):
        return (event["ts"] - zero) / 1e3, event["dur"] / 1e3

    def inside(event, rank):
        step = step_of[rank]
        return event["pid"] == rank and step["ts"] <= event["ts"] <= step["ts"] + step["dur"]

    ranks = sorted(step_of)
    buckets = sorted({e["tid"] for e in events if e.get("cat") == chrome_trace.BUCKET})
    figure = Figure(figsize=(10, 1 + 0.2 * len(ranks) * (1.5 + len(buckets))), layout="constrained")
    axes = figure.subplots()
    labels, y = [], 0
    for rank in ranks:
        mine = [e for e in events if inside(e, rank)]
        phases = [e for e in mine if e.get("cat") == chrome_trace.PHASE]
        for phase in phases:
            axes.broken_barh([bar(phase)], (y - 0.4, 0.8), color=PHASE_COLORS[phase["name"]])
        labels.append((y, f"rank {rank} compute"))
        for tid in buckets:
            y += 1
            for event in (e for e in mine if e["tid"] == tid):
                if event.get("cat") == chrome_trace.BUCKET:
                    axes.broken_barh([bar(event)], (y - 0.4, 0.8), color=BUCKET_COLOR)
                elif event.get("cat") == chrome_trace.STAGE:
                    axes.broken_barh([bar(event)], (y - 0.25, 0.5), color=STAGE_COLORS[event["args"]["op"]], zorder=2)
            labels.append((y, f"bucket {tid - 1}"))
        backward = [e for e in phases if e["name"] == "backward"]
        if backward:
            start, width = bar(backward[-1])
            axes.vlines(start + width, y - len(buckets) - 0.5, y + 0.5, colors="black", linestyles="dashed",
                        linewidth=0.8)
        y += 1.5
    axes.set_yticks([position for position, _ in labels], [text for _, text in labels], fontsize=7)
    axes.invert_yaxis()
    axes.set_xlabel(f"ms from the start of step {number}")
    legend = {**PHASE_COLORS, "bucket (final gradients to done)": BUCKET_COLOR, **STAGE_COLORS}
    figure.legend(handles=[Patch(color=color, label=name) for name, color in legend.items()],
                  loc="outside right upper", fontsize=7)
    axes.set_title(f"step {number}: compute and gradient all-reduce per rank (dashed: end of backward)", fontsize=9)
    return figure
