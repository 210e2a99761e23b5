"""All-reduce algorithms: `AllReduce(comm, algorithm, shape)(buffer)` leaves the SUM in place.

ring is one native all-reduce; hierarchical (node, then across nodes) and torus2d (Mikami et
al. 2018: rows, then columns of an X×Y grid, fewer latency steps than the ring for the same
bytes) are one two-level scheme written once. ring-p2p and torus2d-p2p are ring and torus2d
with every group's collective written out as point-to-point ring steps (minidl/distributed/p2p.py),
for study. A `Plan` is one all-reduce of one buffer, stage
by stage, so that the gradient reducer can overlap it with backward.

Details: docs/distributed.md, "minidl/distributed/allreduce.py".
"""
from typing import NamedTuple

from minidl.backend import get_array_module
from minidl.distributed.comm import DONE
from minidl.distributed.grid import check_shape, square_grid
from minidl.distributed.p2p import RingP2P, native_of
from minidl.errors import UserError
from minidl.intmath import round_up

ALGORITHMS = ("ring", "hierarchical", "torus2d", "ring-p2p", "torus2d-p2p")


def on_grid(algorithm):
    """Whether `algorithm` arranges the ranks in an X×Y grid (torus2d and torus2d-p2p)."""
    return native_of(algorithm) == "torus2d"


class AllReduce:
    def __init__(self, comm, algorithm="torus2d", shape=None):
        """Collective over `comm`: every rank must construct it at the same point, with the same
        arguments. `shape` = (X, Y) for torus2d(-p2p); None takes `square_grid(comm.size)`."""
        if algorithm not in ALGORITHMS:
            raise UserError(f"all-reduce algorithm {algorithm!r} does not exist: choose one of {', '.join(ALGORITHMS)}")
        if shape is not None and not on_grid(algorithm):
            raise UserError(f"a torus shape was given for the {algorithm} all-reduce: it only applies to torus2d "
                            "and torus2d-p2p")
        self.comm, self.algorithm = comm, algorithm
        self.shape = check_shape(shape or square_grid(comm.size), comm.size) if on_grid(algorithm) else None
        if native_of(algorithm) == "ring":
            inner, outer = None, comm
            self.groups = (None, "world")
        elif algorithm == "hierarchical":
            inner, outer = comm.node_comm, _cross_node(comm)
            self.groups = ("node", "nodes")
        else:
            x = self.shape[0]
            inner = comm.split(comm.rank // x, comm.rank % x)
            outer = comm.split(comm.rank % x, comm.rank // x)
            self.groups = ("row", "column")
        inner = inner if inner is not None and inner.size > 1 else None
        outer = outer if outer.size > 1 else None
        # private duplicates: no other collective on these groups can slip between the stages
        # of reductions in flight, and the all-gather never matches a reduce-scatter
        self.inner = inner.dup() if inner is not None else None
        self.inner_gather = inner.dup() if inner is not None else None
        self.outer = outer.dup() if outer is not None else None
        if native_of(algorithm) != algorithm:  # the same stages, each a ring of sends and receives
            self.inner, self.inner_gather, self.outer = (RingP2P(group) if group is not None else None for group in
                                                         (self.inner, self.inner_gather, self.outer))
        self.alignment = inner.size if inner is not None else 1
        self._scratch = {}

    @property
    def name(self):
        """'ring', 'hierarchical', 'torus2d XxY', 'ring-p2p' or 'torus2d-p2p XxY'."""
        return f"{self.algorithm} {self.shape[0]}x{self.shape[1]}" if self.shape else self.algorithm

    def __repr__(self):
        return f"AllReduce({self.name} over {self.comm.size} ranks)"

    def __call__(self, buffer):
        """buffer (1-D, float32 or float64) ← the elementwise SUM over ranks, in place."""
        self.plan(buffer, self._cached_scratch).run()

    def _cached_scratch(self, role, size, like):
        """One array per role, kept from call to call while the size and kind stay the same."""
        kept = self._scratch.get(role)
        if kept is None or kept.size != size or kept.dtype != like.dtype or type(kept) is not type(like):
            kept = self._scratch[role] = _new_scratch(role, size, like)
        return kept

    def plan(self, buffer, scratch=None):
        """A Plan for summing `buffer`; `scratch(role, size, like)` supplies its work arrays
        (default: new ones, owned by the plan)."""
        if buffer.ndim != 1 or buffer.dtype.name not in ("float32", "float64"):
            raise ValueError(f"all-reduce takes a 1-D float32 or float64 buffer, not {buffer.ndim}-D {buffer.dtype}")
        scratch = scratch or _new_scratch
        padded = round_up(buffer.size, self.alignment)
        work = buffer if padded == buffer.size else scratch("padded", padded, buffer)
        inner, outer = self.groups
        if self.inner is None:
            stages = [Stage(outer, self.outer, "allreduce", work, work)] if self.outer is not None else []
        else:
            shard = scratch("shard", padded // self.alignment, buffer)
            stages = [Stage(inner, self.inner, "reduce_scatter", work, shard)]
            if self.outer is not None:
                stages.append(Stage(outer, self.outer, "allreduce", shard, shard))
            stages.append(Stage(inner, self.inner_gather, "allgather", shard, work))
        return Plan(buffer, work, stages)


def _new_scratch(role, size, like):
    return get_array_module(like).zeros(size, like.dtype)


def _cross_node(comm):
    """The cross-node communicator, after checking that every node has as many ranks."""
    sizes = comm.allgather_object(comm.local_size if comm.local_rank == 0 else None)
    sizes = [s for s in sizes if s is not None]
    if len(set(sizes)) > 1:
        raise UserError(f"the hierarchical all-reduce needs the same number of ranks on every node, "
                        f"but the nodes have {', '.join(map(str, sizes))}: start as many ranks per node "
                        "(or set MINIDL_RANKS_PER_NODE to a divisor of the world size), or use torus2d or ring")
    return comm.cross_node_comm


class Stage(NamedTuple):
    """One collective of a plan: `op` over `comm`, the group called `group`, from src to dst."""
    group: str
    comm: object
    op: str
    src: object
    dst: object

    @property
    def nbytes(self):
        """The size of the buffer the stage reduces or gathers (the larger of its two ends)."""
        return max(self.src.nbytes, self.dst.nbytes)


class Plan:
    """One all-reduce of one buffer as a chain of collectives (Stages)."""

    def __init__(self, buffer, work, stages):
        self.buffer, self.work, self.stages = buffer, work, stages
        self.next = 0  # the stage to start next
        self.request = DONE
        self.on_stage = None
        self._seen_done = 0  # stages whose completion on_stage has been told

    def run(self):
        """Reduce now, blocking."""
        self._prepare()
        for stage in self.stages:
            stage.comm.run(stage.op, stage.src, stage.dst)
        self._finish()

    # stepwise, non-blocking: begin(), then advance() after ready() while stages remain, finish()

    def begin(self):
        self.next, self.request, self._seen_done = 0, DONE, 0
        self._prepare()
        if self.stages:
            self.advance()

    @property
    def stages_left(self):
        return self.next < len(self.stages)

    def ready(self, block=False):
        """Whether the running stage has completed (with block=True: once it has; the request
        waited for is dropped, so waiting again costs nothing)."""
        if block:
            self.request.wait()
            self.request = DONE
        elif not self.request.test():
            return False
        if self.on_stage is not None and self._seen_done < self.next:
            self._seen_done = self.next
            self.on_stage(self.next - 1, "done")
        return True

    def advance(self):
        """Start the next stage."""
        stage = self.stages[self.next]
        if self.on_stage is not None:
            self.on_stage(self.next, "start")
        self.request = stage.comm.start(stage.op, stage.src, stage.dst)
        if self.on_stage is not None:
            self.on_stage(self.next, "issued")
        self.next += 1

    def finish(self):
        """After the last stage has started: wait for it (on a GPU the compute stream waits),
        then copy the result out of the padded scratch."""
        self.ready(block=True)
        self._finish()

    def _prepare(self):
        if self.work is not self.buffer:
            self.work[:self.buffer.size] = self.buffer
            self.work[self.buffer.size:] = 0

    def _finish(self):
        if self.work is not self.buffer:
            self.buffer[...] = self.work[:self.buffer.size]
