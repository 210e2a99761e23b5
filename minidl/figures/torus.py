"""The 2D-torus all-reduce's three stages on a 2×4 grid of 8 ranks, from the engine's own plan.

For each rank, `AllReduce(comm, "torus2d", (2, 4))` is built on minidl.plan's recording
communicator as that rank sees it (`focus`), and its plan's stages name the rank's row and
column groups: the groups drawn are the ones the code splits, not a drawing of the rule.
"""
import numpy

from minidl.distributed import AllReduce
from minidl.figures.style import new_figure
from minidl.plan.stages import RecordingComm

SHAPE = (2, 4)  # X ranks per row, Y rows
GPUS_PER_NODE = 2  # a row per node
ELEMENTS = 1 << 20  # a 4 MiB float32 buffer, for the bytes in the labels
STEPS = {"reduce_scatter": 1, "allgather": 1, "allreduce": 2}  # ring steps per member beyond the first
NAMES = {"reduce_scatter": "reduce-scatter", "allreduce": "all-reduce", "allgather": "all-gather"}
COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]


def stage_groups(shape=SHAPE):
    """[(op, group name, bytes of the buffer the stage reduces or gathers, sorted list of the groups' world ranks)] of each stage, from every
    rank's plan."""
    x, y = shape
    stages = None
    for rank in range(x * y):
        comm = RecordingComm(numpy.arange(x * y), GPUS_PER_NODE, focus=rank)
        plan = AllReduce(comm, "torus2d", shape).plan(numpy.zeros(ELEMENTS, numpy.float32))
        if stages is None:
            stages = [(s.op, s.group, s.nbytes, set()) for s in plan.stages]
        for (_, _, _, groups), stage in zip(stages, plan.stages):
            groups.add(tuple(int(r) for r in stage.comm.ranks))
    return [(op, group, nbytes, sorted(groups)) for op, group, nbytes, groups in stages]


def torus_figure(shape=SHAPE):
    x, y = shape
    stages = stage_groups(shape)
    figure, panels = new_figure(1, len(stages), (12, 5.5))
    for index, (axes, (op, group, nbytes, groups)) in enumerate(zip(panels, stages)):
        places = {rank: (rank % x, -(rank // x)) for rank in range(x * y)}  # column rank % X, row rank // X
        for color, members in zip(COLORS * len(groups), groups):
            for i, rank in enumerate(members):
                after = members[(i + 1) % len(members)]
                if after != rank:
                    axes.annotate("", places[after], places[rank], arrowprops=dict(
                        arrowstyle="-|>", color=color, shrinkA=14, shrinkB=14, connectionstyle="arc3,rad=0.25"))
        for rank, (column, row) in places.items():
            axes.scatter([column], [row], s=650, color="white", edgecolors="black", zorder=3)
            axes.text(column, row, str(rank), ha="center", va="center", fontsize=10, zorder=4)
        size = len(groups[0])
        steps = STEPS[op] * (size - 1)
        axes.set_title(f"stage {index + 1}: {NAMES[op]} along each {group}\n{len(groups)} rings of {size}, "
                       f"{steps} step{'s' * (steps > 1)} of {nbytes / size / 1024:.0f} KiB per rank", fontsize=9)
        axes.set_xlim(-0.7, x - 0.3)
        axes.set_ylim(-y + 0.4, 0.6)
        axes.set_aspect("equal")
        axes.axis("off")
    total = sum(STEPS[op] * (len(groups[0]) - 1) for op, _, _, groups in stages)
    figure.suptitle(f"2D-torus all-reduce of a {ELEMENTS * 4 >> 20} MiB buffer on a {x}x{y} grid (rank r at column "
                    f"r % {x} of row r // {x}): {total} steps = 2(X−1) + 2(Y−1), the ring's 2(XY−1) = "
                    f"{2 * (x * y - 1)}", fontsize=10)
    return figure
