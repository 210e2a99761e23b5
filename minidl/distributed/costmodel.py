"""An alpha–beta model of all-reduce time: how ring, recursive halving–doubling, hierarchical
and 2D-torus all-reduce scale to thousands of GPUs.

Each algorithm is a sequence of phases of rounds, a round costing the per-message latency α plus
its message over the link it crosses (NVLink within a node; the node's shared network adapters
across nodes). The defaults describe ABCI, where the Sony runs took place (Mikami et al. 2018);
`calibrate` fits α and the bandwidth of one machine from benchmark measurements instead.

Details: docs/distributed.md, "minidl/distributed/costmodel.py".
"""
import math
from dataclasses import dataclass, replace

import numpy

from minidl.distributed.p2p import native_of

RESNET50_GRADIENT_BYTES = 25_557_032 * 4  # ResNet-50's parameters in fp32 (minidl's = torchvision's)


@dataclass(frozen=True)
class Machine:
    gpus_per_node: int = 4
    alpha: float = 5e-6  # seconds per message
    intra_bandwidth: float = 50e9  # bytes/s from a GPU to a GPU of its node
    node_bandwidth: float = 25e9  # bytes/s from a node to the network, all its GPUs together
    intra_alpha: float | None = None  # seconds per message within a node (None: alpha)


ABCI = Machine()


@dataclass(frozen=True)
class Phase:
    name: str
    steps: int
    chunk: float  # bytes each rank sends per step
    bandwidth: float
    alpha: float | None = None  # seconds per round where it is not the machine's alpha (within a node)

    def seconds(self, alpha):
        return self.steps * ((alpha if self.alpha is None else self.alpha) + self.chunk / self.bandwidth)


def ring_bandwidth(machine, size, per_node):
    """The bandwidth per ring of `size` ranks with `per_node` consecutive ranks on each node."""
    per_node = min(per_node, size, machine.gpus_per_node)
    if per_node == size:
        return machine.intra_bandwidth
    return min(machine.intra_bandwidth, machine.node_bandwidth * per_node / machine.gpus_per_node)


def ring_phases(machine, name, size, per_node, nbytes, allreduce=True):
    """A ring reduce-scatter (+ all-gather when `allreduce`) of `nbytes` over `size` ranks."""
    if size == 1:
        return []
    bandwidth = ring_bandwidth(machine, size, per_node)
    steps = (2 if allreduce else 1) * (size - 1)
    inside = min(per_node, machine.gpus_per_node) >= size
    return [Phase(name, steps, nbytes / size, bandwidth, machine.intra_alpha if inside else None)]


def ring(machine, ranks, nbytes):
    return ring_phases(machine, f"ring over {ranks}", ranks, machine.gpus_per_node, nbytes)


def halving_doubling(machine, ranks, nbytes):
    """Rabenseifner: recursive-halving reduce-scatter, recursive-doubling all-gather over the
    largest power of two p' ≤ p; the p − p' extra ranks first hand in their whole buffer and
    get the result back at the end (2 more steps of n bytes)."""
    g, power = machine.gpus_per_node, 1 << (ranks.bit_length() - 1)
    phases = []
    if power < ranks:
        phases.append(Phase("fold extra ranks in and out", 2, nbytes, machine.node_bandwidth / g))
    for level in range(power.bit_length() - 1):
        distance = 1 << level  # partner = rank XOR distance, sending half of what is left
        inside = distance < g
        bandwidth = machine.intra_bandwidth if inside else machine.node_bandwidth / g
        alpha = machine.intra_alpha if inside else None
        phases.append(Phase(f"distance {distance}", 2, nbytes / (2 << level), bandwidth, alpha))
    return phases


def torus(machine, x, y, nbytes):
    """Mikami et al.: reduce-scatter along rows of X, all-reduce along columns of Y on the
    1/X shard, all-gather along rows."""
    g = machine.gpus_per_node
    row = ring_phases(machine, f"row {x}", x, min(x, g), nbytes, allreduce=False)
    column = ring_phases(machine, f"column {y}", y, max(1, g // x), nbytes / x)
    return row + column + row


def hierarchical(machine, ranks, nbytes):
    """Reduce-scatter in the node, all-reduce across nodes on 1/g, all-gather in the node:
    the torus whose rows are the nodes."""
    return torus(machine, machine.gpus_per_node, ranks // machine.gpus_per_node, nbytes)


def of_algorithm(algorithm, machine, ranks, nbytes, shape=None, per_node=None):
    """The phases of `--allreduce algorithm` on `ranks` ranks: ring and ring-p2p are `ring` (the
    p2p one takes exactly its 2(N−1) steps; the native call is taken to), torus2d and torus2d-p2p
    `torus` on `shape` = (X, Y), hierarchical the torus whose rows are nodes of `per_node`
    ranks (default: the machine's GPUs per node)."""
    name = native_of(algorithm)
    if name == "ring":
        return ring(machine, ranks, nbytes)
    if name == "torus2d":
        return torus(machine, *shape, nbytes)
    if name == "hierarchical":
        per_node = per_node or machine.gpus_per_node
        return torus(machine, per_node, ranks // per_node, nbytes)
    raise ValueError(f"the cost model has no all-reduce {algorithm!r}")


def seconds(phases, machine):
    return sum(phase.seconds(machine.alpha) for phase in phases)


def steps(phases):
    return sum(phase.steps for phase in phases)


def bytes_sent(phases):
    """Bytes each rank sends in the whole all-reduce."""
    return sum(phase.steps * phase.chunk for phase in phases)


def candidates(machine, ranks, nbytes, grids):
    """(label, phases) for every algorithm on `ranks` ranks; torus grids as given."""
    rows = [("ring", ring(machine, ranks, nbytes)),
            ("halving-doubling", halving_doubling(machine, ranks, nbytes))]
    if ranks % machine.gpus_per_node == 0:
        rows.append((f"hierarchical {machine.gpus_per_node}/node", hierarchical(machine, ranks, nbytes)))
    rows += [(f"torus2d {x}x{y}", torus(machine, x, y, nbytes)) for x, y in grids]
    return rows


def sony_grids(ranks, gpus_per_node):
    """The grids a run of `ranks` GPUs could use: rows of one node (X = GPUs per node), and the
    squarest X ≥ GPUs per node that keeps rows node-aligned (fewest latency steps)."""
    square = max((x for x in range(gpus_per_node, math.isqrt(ranks) + 1, gpus_per_node) if ranks % x == 0),
                 default=gpus_per_node)
    return sorted({(gpus_per_node, ranks // gpus_per_node), (square, ranks // square)})


def calibrate(measurements, ranks):
    """A one-node Machine whose α and bandwidth fit (bytes, seconds) pairs of the native ring
    all-reduce on `ranks` ranks best: t = 2(p−1)·α + 2(p−1)/p · n / B, least squares on the
    relative error, so that small buffers (which pin α down) count as much as large ones."""
    nbytes, times = numpy.array(measurements, dtype=float).T
    design = numpy.stack([numpy.full_like(nbytes, 2 * (ranks - 1)), 2 * (ranks - 1) / ranks * nbytes], axis=1)
    weighted, ones = design / times[:, None], numpy.ones_like(times)
    (alpha, inverse_bandwidth), *_ = numpy.linalg.lstsq(weighted, ones, rcond=None)
    if alpha < 0:  # the latency is lost in the noise: fit the bandwidth alone
        alpha = 0.0
        (inverse_bandwidth,), *_ = numpy.linalg.lstsq(weighted[:, 1:], ones, rcond=None)
    bandwidth = 1 / max(inverse_bandwidth, 1e-15)
    return replace(ABCI, gpus_per_node=ranks, alpha=alpha, intra_bandwidth=bandwidth,
                   node_bandwidth=bandwidth * ranks)
