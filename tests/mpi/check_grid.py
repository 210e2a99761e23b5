"""Under mpiexec -n N: the default torus grid from the job's layout. For nodes of 1, 2, 4 and N
ranks (and the world's own grouping, which MINIDL_RANKS_PER_NODE may set), `choose_grid` finds
the ranks per node from the node communicator and every rank picks the grid that
`grid.predict` gives for that layout; --torus-shape's grid is taken as given."""
from common import Checks

from minidl import distributed
from minidl.distributed import grid

world = distributed.init()
checks = Checks(world)
buckets = [4e6, 4e6, 1e6]
for per_node in sorted({1, 2, 4, world.size}):
    if world.size % per_node:
        continue
    comm = distributed.Communicator(ranks_per_node=per_node)
    choice = distributed.choose_grid(comm, buckets)
    checks.true(choice.ranks_per_node == comm.local_size == per_node, f"{per_node} per node: the layout")
    checks.equal(choice.shape, grid.predict(world.size, per_node, buckets).shape, f"{per_node} per node: the grid")
    checks.true(len(set(world.allgather_object(choice.shape))) == 1, f"{per_node} per node: one grid on every rank")
given = distributed.choose_grid(world, buckets, shape=(1, world.size))
checks.true(given.shape == (1, world.size) and given.source == "--torus-shape", "a given grid")
checks.true(given.ranks_per_node == world.local_size, "the world's own grouping")
checks.finish()
