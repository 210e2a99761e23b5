"""Under mpiexec -n N: clock offsets from rank 0 by ping-pong. The ranks share one machine's
clock, so the true offset of a clock shifted by 10·rank seconds is exactly 10·rank: every
estimate must lie within its own uncertainty of it."""
import time

from common import Checks

from minidl import distributed

comm = distributed.init()
checks = Checks(comm)
for shift in (0.0, 10.0):
    offsets = distributed.clock_offsets(comm, lambda: time.perf_counter() + shift * comm.rank)
    if comm.rank == 0:
        checks.true(len(offsets) == comm.size and offsets[0] == (0.0, 0.0), "rank 0 is the reference")
        for rank, (offset, uncertainty) in enumerate(offsets[1:], 1):
            checks.true(0 < uncertainty < 0.1, f"rank {rank}: uncertainty {uncertainty} s")
            checks.true(abs(offset - shift * rank) <= uncertainty, f"rank {rank}: offset {offset} s, shift {shift}")
    else:
        checks.true(offsets is None, "only rank 0 gets the offsets")
checks.finish()
