"""The gradient exchange of one step, as the engine would run it: buckets and their stages.

`RecordingComm` runs nothing: it stands for every rank of its group at once (`rank` holds each
member's rank, so `split(color, key)` sees every member's color and key) and keeps the groups it
is split into, as one member (`focus`, the first by default) sees them. The engine's `AllReduce` builds its groups and plans on it, and its
`GradientReducer` cuts the real model's flat gradient buffer into buckets: the stages priced here
come from the code that runs them.

Details: docs/plan.md, "The exchange".
"""
import dataclasses
import math

import numpy

from minidl.distributed import AllReduce, GradientReducer, costmodel
from minidl.optim import FlatParameters


class RecordingComm:
    def __init__(self, ranks, gpus_per_node, focus=0):
        self.ranks = numpy.asarray(ranks)  # the world ranks of the members, in group order
        self.gpus_per_node = gpus_per_node
        self.focus = focus  # the member whose groups split() keeps
        self.size = len(self.ranks)
        self.rank = numpy.arange(self.size)  # every member's rank at once
        nodes = self.ranks // gpus_per_node
        self.per_node = int(numpy.count_nonzero(nodes == nodes[0]))  # members on each node
        # what the first member sees; every node holds the same number of members, so every member sees it
        self.local_rank, self.local_size = 0, self.per_node

    def __repr__(self):
        return f"RecordingComm({self.size} ranks, {self.per_node} per node)"

    def split(self, color, key):
        """The focus member's group: the members whose color is its color, ordered by key."""
        color, key = numpy.broadcast_to(color, self.size), numpy.broadcast_to(key, self.size)
        sizes = numpy.unique(color, return_counts=True)[1]
        if len(set(sizes.tolist())) > 1:
            raise ValueError(f"a split of {self.size} ranks into groups of {sorted(set(sizes.tolist()))}: "
                             "the simulation models groups of one size")
        members = numpy.flatnonzero(color == color[self.focus])
        members = members[numpy.argsort(key[members], kind="stable")]
        return RecordingComm(self.ranks[members], self.gpus_per_node, int(numpy.flatnonzero(members == self.focus)[0]))

    def dup(self):
        return RecordingComm(self.ranks, self.gpus_per_node, self.focus)

    @property
    def node_comm(self):
        nodes = self.ranks // self.gpus_per_node
        return RecordingComm(self.ranks[nodes == nodes[0]], self.gpus_per_node)

    @property
    def cross_node_comm(self):
        """One member per node: those with the first member's place in their node."""
        return RecordingComm(self.ranks[::self.per_node], self.gpus_per_node)

    def allgather_object(self, value):
        return [value] * self.size


@dataclasses.dataclass(frozen=True)
class Stage:
    group: str  # "world", "row", "column", "node", "nodes"
    op: str  # "reduce_scatter", "allreduce", "allgather"
    ranks: int
    per_node: int  # of those ranks, how many share a node
    nbytes: int

    def seconds(self, links):
        """Its time on `links` (a costmodel.Machine): a ring over its ranks."""
        phases = costmodel.ring_phases(links, f"{self.op} over {self.group}", self.ranks, self.per_node,
                                       self.nbytes, allreduce=self.op == "allreduce")
        return costmodel.seconds(phases, links)


@dataclasses.dataclass(frozen=True)
class Bucket:
    start: int  # elements of the flat gradient buffer
    stop: int
    parameters: tuple  # indices of the parameters that overlap it
    stages: tuple


@dataclasses.dataclass(frozen=True)
class Exchange:
    """How one step's gradient is reduced: the algorithm (with its grid), the buckets in launch order."""
    algorithm: str  # AllReduce.name: "ring", "hierarchical", "torus2d XxY"
    buckets: tuple
    flat_elements: int  # the padded flat buffer's length


def exchange(model, world_size, gpus_per_node, algorithm, shape, bucket_mb):
    """The Exchange of `model`'s gradient over `world_size` ranks (nodes of `gpus_per_node`)."""
    comm = RecordingComm(numpy.arange(world_size), gpus_per_node)
    allreduce = AllReduce(comm, algorithm, shape)
    flat = FlatParameters(model.parameters(), math.lcm(1024, allreduce.alignment))  # as the trainer pads it
    reducer = GradientReducer(allreduce, flat, bucket_mb)
    reducer.close()
    buckets = []
    for (start, stop), plan in zip(reducer.bounds, reducer.plans):
        overlapping = tuple(i for i, (begin, end) in enumerate(flat.segments) if begin < stop and start < end)
        stages = tuple(Stage(s.group, s.op, s.comm.size, s.comm.per_node, s.nbytes) for s in plan.stages)
        buckets.append(Bucket(start, stop, overlapping, stages))
    return Exchange(allreduce.name, tuple(buckets), flat.grad.size)
