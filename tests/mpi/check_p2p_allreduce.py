"""Under mpiexec -n N: the point-to-point all-reduces (ring-p2p, torus2d-p2p on every grid) against
the native ones, and their step counts against the formulas and the cost model.

Integer-valued buffers sum exactly in any order, so there the p2p results must equal the native
ones bit for bit; random float64 buffers sum in another order, so there they must agree to
rounding. Lengths are odd (and shorter than the ranks), every reduction is called twice, and once
stage by stage as the gradient reducer runs it.
"""
import numpy as np
from common import Checks

from minidl import distributed
from minidl.distributed import costmodel
from minidl.distributed.p2p import RingP2P

LENGTHS = (0, 1, 7, 1001, 4099)

comm = distributed.init()
checks = Checks(comm)
rank, size = comm.rank, comm.size
rng = np.random.default_rng(11)


def steps_taken(allreduce):
    groups = (allreduce.inner, allreduce.inner_gather, allreduce.outer)
    return sum(group.steps for group in groups if group is not None)


def stepwise(allreduce, buffer):
    """The reduction as GradientReducer drives it: begin, advance stage by stage, finish."""
    plan = allreduce.plan(buffer)
    plan.begin()
    while plan.stages_left:
        plan.ready(block=True)
        plan.advance()
    plan.finish()


def check_against_native(p2p, native, label, expected_steps):
    for length in LENGTHS:
        everyone = rng.integers(-1000, 1000, (size, length))
        for dtype in (np.float32, np.float64):
            for call in (1, 2):
                mine, reference = everyone[rank].astype(dtype) * call, everyone[rank].astype(dtype) * call
                before = steps_taken(p2p)
                p2p(mine)
                native(reference)
                checks.equal(mine, reference, f"{label} {dtype.__name__} n={length} call {call}: equals native")
                checks.true(steps_taken(p2p) - before == expected_steps,
                            f"{label}: {steps_taken(p2p) - before} steps, not {expected_steps}")
        floats = rng.standard_normal((size, length))
        mine, reference = floats[rank].copy(), floats[rank].copy()
        stepwise(p2p, mine)
        native(reference)
        checks.close(mine, reference, f"{label} random float64 n={length} stepwise", rtol=1e-12, atol=1e-12)
        checks.close(mine, floats.sum(axis=0), f"{label} random float64 n={length}: the sum", rtol=1e-12, atol=1e-12)
        first = mine.copy()
        comm.bcast(first)
        checks.equal(mine, first, f"{label} n={length}: every rank holds rank 0's bits")


def check_collectives():
    """RingP2P's reduce-scatter and all-gather against the communicator's own, src left untouched."""
    ring = RingP2P(comm.dup()) if size > 1 else None
    for block in (1, 3):
        src = rng.integers(-50, 50, size * block).astype(np.float64) + rank
        kept, ours, theirs = src.copy(), np.empty(block), np.empty(block)
        if ring is not None:
            ring.run("reduce_scatter", src, ours)
            comm.reduce_scatter(src, theirs)
            checks.equal(ours, theirs, f"reduce_scatter block {block}")
            checks.equal(src, kept, "reduce_scatter leaves its source as it was")
            gathered, native = np.empty(size * block), np.empty(size * block)
            ring.run("allgather", ours + rank, gathered)
            comm.allgather(ours + rank, native)
            checks.equal(gathered, native, f"allgather block {block}")


check_collectives()
ring_steps = 2 * (size - 1)
check_against_native(distributed.AllReduce(comm, "ring-p2p"), distributed.AllReduce(comm, "ring"), "ring-p2p", ring_steps)
checks.true(costmodel.steps(costmodel.of_algorithm("ring-p2p", costmodel.ABCI, size, 1e6)) == ring_steps,
            "the cost model's ring-p2p takes 2(N-1) steps")
for x in (d for d in range(1, size + 1) if size % d == 0):
    y = size // x
    torus_steps = 2 * (x - 1) + 2 * (y - 1)
    check_against_native(distributed.AllReduce(comm, "torus2d-p2p", (x, y)), distributed.AllReduce(comm, "torus2d", (x, y)),
                         f"torus2d-p2p {x}x{y}", torus_steps)
    modelled = costmodel.steps(costmodel.of_algorithm("torus2d-p2p", costmodel.ABCI, size, 1e6, (x, y)))
    checks.true(modelled == torus_steps, f"the cost model's torus2d-p2p {x}x{y} takes {modelled} steps, not {torus_steps}")
checks.finish()
