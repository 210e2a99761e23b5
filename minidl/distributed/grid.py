"""Which X×Y grid the 2D-torus all-reduce arranges the ranks in (rank r at column r % X of row r // X).

`--torus-shape XxY` names the grid; without it a run takes the grid whose rows line up with the
nodes that the alpha–beta cost model predicts fastest for the run's gradient, buckets and
layout. The choice is a function of those numbers only, so every rank makes the same one.

Details: docs/distributed.md, "minidl/distributed/grid.py".
"""
import dataclasses
import math

from minidl.distributed import costmodel
from minidl.distributed.reducer import bucket_bounds
from minidl.errors import UserError

TIE = 1e-9  # relative difference of predicted times below which grids tie


def parse_shape(text):
    """'4x2' -> (4, 2), for a --torus-shape flag."""
    parts = str(text).lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise UserError(f"torus shape {text!r} is not XxY with positive integers: write e.g. 4x2")
    return int(parts[0]), int(parts[1])


def square_grid(size):
    """(X, Y) with X·Y = size, X ≤ Y and X as large as possible: the grid with the fewest steps."""
    x = max(d for d in range(1, math.isqrt(size) + 1) if size % d == 0)
    return x, size // x


def check_shape(shape, size):
    x, y = shape
    if x * y != size:
        options = ", ".join(f"{d}x{size // d}" for d in range(1, size + 1) if size % d == 0)
        raise UserError(f"torus shape {x}x{y} has {x * y} ranks but the job has {size}: use one of "
                        f"{options}, or leave the shape out to take the default")
    return x, y


def bucket_sizes(nbytes, bucket_mb, itemsize=4):
    """The bytes of each bucket that a gradient of `nbytes` (float32 by default) is reduced in."""
    return [(stop - start) * itemsize for start, stop in bucket_bounds(int(nbytes) // itemsize, itemsize, bucket_mb, 1)]


def aligned_grids(ranks, per_node):
    """The (X, Y) grids of `ranks` whose rows line up with nodes of `per_node` ranks."""
    return [(x, ranks // x) for x in range(1, ranks + 1)
            if ranks % x == 0 and (per_node % x == 0 or x % per_node == 0)]


def latency_steps(shape):
    x, y = shape
    return 2 * (x - 1) + 2 * (y - 1)


@dataclasses.dataclass(frozen=True)
class GridChoice:
    shape: tuple
    source: str  # "cost model" or "--torus-shape"
    ranks_per_node: int
    nodes: int
    buckets: tuple  # bytes of each bucket
    predicted: dict  # "chosen", "squarest", "one row per node" -> ((X, Y), seconds)

    def describe(self):
        """One line for the run's banner: the grid, why, and the model's times of the alternatives."""
        ranks = self.shape[0] * self.shape[1]
        why = ("the cost model's fastest" if self.source == "cost model" else "from --torus-shape") + \
              f" for {ranks} ranks, {self.ranks_per_node} per node on {self.nodes} node{'s' * (self.nodes > 1)}"
        times = ", ".join(f"{label} {x}x{y} {seconds * 1e3:.3g} ms"
                          for label, ((x, y), seconds) in self.predicted.items())
        count = len(self.buckets)
        return (f"torus2d grid {self.shape[0]}x{self.shape[1]} ({why}); predicted reduction of the "
                f"{sum(self.buckets) / 1e6:.3g} MB gradient in {count} bucket{'s' * (count > 1)} on the model's "
                f"ABCI-like links: {times}")

    def to_dict(self):
        return {"shape": f"{self.shape[0]}x{self.shape[1]}", "source": self.source,
                "ranks_per_node": self.ranks_per_node, "nodes": self.nodes, "bucket_bytes": list(self.buckets),
                "predicted_ms": {label: {"shape": f"{x}x{y}", "ms": seconds * 1e3}
                                 for label, ((x, y), seconds) in self.predicted.items()}}


def predict(ranks, per_node, buckets, shape=None, machine=costmodel.ABCI):
    """The GridChoice for `ranks` ranks, `per_node` per node, a gradient reduced in buckets of
    the given bytes: `shape` where given (--torus-shape), else the fastest aligned grid on the
    links of `machine` (the cost model's ABCI-like ones by default)."""
    machine = dataclasses.replace(machine, gpus_per_node=per_node)
    buckets = tuple(buckets)

    def seconds(grid):
        return sum(costmodel.seconds(costmodel.torus(machine, *grid, nbytes), machine) for nbytes in buckets)

    times = {grid: seconds(grid) for grid in aligned_grids(ranks, per_node)}
    fastest = min(times.values())
    tied = [grid for grid, t in times.items() if t <= fastest * (1 + TIE)]
    best = min(tied, key=lambda grid: (latency_steps(grid), -grid[0]))
    chosen = check_shape(shape, ranks) if shape else best
    alternatives = {"chosen": chosen, "squarest": square_grid(ranks)}
    if ranks % per_node == 0:
        alternatives["one row per node"] = (per_node, ranks // per_node)
    return GridChoice(chosen, "--torus-shape" if shape else "cost model", per_node, math.ceil(ranks / per_node),
                      buckets, {label: (grid, seconds(grid)) for label, grid in alternatives.items()})


def choose_grid(comm, buckets, shape=None):
    """`predict` for this job's layout (collective: every rank must call it)."""
    per_node = max(comm.allgather_object(comm.local_size))
    return predict(comm.size, per_node, buckets, shape)
