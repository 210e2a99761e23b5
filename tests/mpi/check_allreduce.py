"""Under mpiexec -n N: every collective and every all-reduce algorithm against closed forms.

    check_allreduce.py [PER_HOST]   # PER_HOST ranks on each of several hosts (tests/mpi/hosts.py)

Rank r holds values built from small integers and halves, so every sum is exact in float32
and float64 whatever order the additions take: results must match the closed form bit for
bit. A random float64 case checks non-exact data to a tolerance, and that every rank ends
with the same bits. Each collective is called twice on the same objects (reused scratch).
"""
import os
import sys

import numpy as np
from common import Checks

from minidl import distributed
from minidl.errors import UserError

LENGTHS = (0, 1, 7, 1001, 65537)
DTYPES = (np.float32, np.float64)

comm = distributed.init()
checks = Checks(comm)
rank, size = comm.rank, comm.size
divisors = [d for d in range(1, size + 1) if size % d == 0]


def pattern(length, dtype, power):
    """Rank r's buffer: (r + 1)^power · ((i mod 17) − 8) / 2; its sum over ranks is closed-form."""
    base = ((np.arange(length) % 17) - 8) / 2
    return ((rank + 1) ** power * base).astype(dtype), (sum((r + 1) ** power for r in range(size)) * base)


def check_allreduce(allreduce, label):
    for dtype in DTYPES:
        for length in LENGTHS:
            for power in (1, 2):  # the second call reuses the sub-communicators and scratch
                buffer, expected = pattern(length, dtype, power)
                allreduce(buffer)
                checks.equal(buffer, expected.astype(dtype), f"{label} {dtype.__name__} n={length} call {power}")
    everyone = np.random.default_rng(7).standard_normal((size, 4099))
    buffer = everyone[rank].copy()
    allreduce(buffer)
    checks.close(buffer, everyone.sum(axis=0), f"{label} random float64", rtol=1e-12)
    first = buffer.copy()
    comm.bcast(first)
    checks.equal(buffer, first, f"{label}: every rank holds rank 0's bits")


def check_collectives():
    for dtype in DTYPES:
        for block in (1, 5):
            for call in (1, 2):
                src = np.arange(size * block, dtype=dtype) * (rank + call)
                dst = np.full(block, -1, dtype=dtype)
                comm.reduce_scatter(src, dst)
                scale = size * (size + 2 * call - 1) / 2  # Σ_r (r + call)
                checks.equal(dst, np.arange(rank * block, (rank + 1) * block) * scale,
                             f"reduce_scatter {dtype.__name__} block {block} call {call}")
                gathered = np.zeros(size * block, dtype=dtype)
                comm.allgather(np.full(block, rank + call, dtype=dtype), gathered)
                checks.equal(gathered, np.repeat(np.arange(size) + call, block), f"allgather call {call}")
                root = (call * 3) % size
                value = np.full(block, rank * 10 + call, dtype=dtype)
                comm.bcast(value, root)
                checks.equal(value, np.full(block, root * 10 + call), f"bcast from {root} call {call}")
                buffer = np.full(3, rank + call, dtype=dtype)
                request = comm.start("allreduce", buffer, buffer)
                request.wait()
                checks.equal(buffer, np.full(3, scale), f"started allreduce call {call}")
                checks.true(request.test(), "a completed request tests complete")
    checks.equal(comm.sum([1, rank]), [size, size * (size - 1) / 2], "sum of numbers")


def check_nodes(ranks_per_node):
    grouped = distributed.Communicator(ranks_per_node=ranks_per_node)
    nodes = -(-size // ranks_per_node)
    checks.true((grouped.local_rank, grouped.node, grouped.num_nodes) == (rank % ranks_per_node, rank // ranks_per_node, nodes),
                f"node grouping by {ranks_per_node}: {grouped.local_rank}, {grouped.node}, {grouped.num_nodes}")
    return grouped


check_collectives()
check_allreduce(distributed.AllReduce(comm, "ring"), "ring")
check_allreduce(distributed.AllReduce(comm, "torus2d"), f"torus2d default {distributed.square_grid(size)}")
for x in divisors:
    check_allreduce(distributed.AllReduce(comm, "torus2d", (x, size // x)), f"torus2d {x}x{size // x}")
for ranks_per_node in divisors:
    allreduce = distributed.AllReduce(check_nodes(ranks_per_node), "hierarchical")
    checks.true(allreduce.alignment == ranks_per_node, f"hierarchical alignment {allreduce.alignment}")
    check_allreduce(allreduce, f"hierarchical {ranks_per_node} ranks per node")
# the world communicator groups by $MINIDL_RANKS_PER_NODE when set, else by the real node: this
# machine, or each of the hosts
per_node = int(os.environ.get("MINIDL_RANKS_PER_NODE", sys.argv[1] if len(sys.argv) > 1 else size))
check_allreduce(distributed.AllReduce(comm, "hierarchical"), f"hierarchical, {per_node} ranks per node from the environment")
checks.true((comm.local_rank, comm.local_size, comm.num_nodes) == (rank % per_node, per_node, size // per_node),
            f"world grouping: local rank {comm.local_rank} of {comm.local_size}, {comm.num_nodes} nodes")

checks.raises(UserError, f"has {size + 1} ranks but the job has {size}",
              lambda: distributed.AllReduce(comm, "torus2d", (size + 1, 1)), "a torus larger than the job")
if size > 2:  # size - 1 ranks per node leaves a smaller last node
    checks.raises(UserError, "same number of ranks on every node",
                  lambda: distributed.AllReduce(check_nodes(size - 1), "hierarchical"), "uneven nodes")
checks.finish()
