"""The ring's collectives written from point-to-point messages, for study: `--allreduce ring-p2p`
and `--allreduce torus2d-p2p`.

`RingP2P(group)` stands in for a group's Communicator in an all-reduce's stages: a reduce-scatter
is N − 1 steps (send a block to the right, add the block from the left), an all-gather N − 1 more
(pass the finished blocks on), an all-reduce both: 2(N − 1); the torus takes (X − 1) + 2(Y − 1) +
(X − 1). `steps` counts them. Blocking, over MPI, CuPy staged through host memory.

Details: docs/distributed.md, "minidl/distributed/p2p.py".
"""
import numpy

from minidl.distributed import watchdog
from minidl.distributed.comm import DONE, check_arguments
from minidl.distributed.launch import load_mpi

SUFFIX = "-p2p"  # `ring` → `ring-p2p`, `torus2d` → `torus2d-p2p`


def native_of(algorithm):
    """The algorithm whose stages `algorithm` runs: 'torus2d-p2p' → 'torus2d' ('ring' → 'ring')."""
    return algorithm.removesuffix(SUFFIX)


class RingP2P:
    def __init__(self, group):
        self.group = group  # a Communicator of more than one rank
        self.size, self.rank = group.size, group.rank
        self.right, self.left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        self.steps = 0  # send/receive steps taken since construction

    def start(self, op, src, dst):
        """Run `op` now; the request of a reduction that is already complete."""
        self.run(op, src, dst)
        return DONE

    def run(self, op, src, dst):
        """`op` ("allreduce" in place, "reduce_scatter" or "allgather"), as Communicator.run does it."""
        check_arguments(op, src, dst, self.size)
        if isinstance(dst, numpy.ndarray):
            getattr(self, op)(src, dst)
            return
        host_src = src.get()  # CuPy: through host memory
        host_dst = host_src if dst is src else numpy.empty(dst.shape, dst.dtype)
        getattr(self, op)(host_src, host_dst)
        dst.set(host_dst)

    def allreduce(self, buffer, _=None):
        """buffer ← the SUM over ranks: reduce-scatter, then all-gather, over blocks of any length."""
        bounds = [i * buffer.size // self.size for i in range(self.size + 1)]
        blocks = [buffer[start:stop] for start, stop in zip(bounds, bounds[1:])]
        self._reduce_scatter(blocks, blocks[self.rank])
        self._allgather(blocks)

    def reduce_scatter(self, src, dst):
        """dst ← the SUM over ranks of block `rank` of src (src is left as it was)."""
        self._reduce_scatter(numpy.split(src, self.size), dst)

    def allgather(self, src, dst):
        """dst ← every rank's src, in rank order."""
        blocks = numpy.split(dst, self.size)
        blocks[self.rank][...] = src
        self._allgather(blocks)

    def _reduce_scatter(self, blocks, dst):
        """N − 1 steps: at step t, send the partial sum of block (rank − t − 1) mod N to the right
        and receive the left's partial sum of block (rank − t − 2) mod N, adding this rank's own
        block to it. After the last step the partial sum received is block `rank`, complete."""
        largest = max(block.size for block in blocks)
        outgoing = numpy.empty(largest, dst.dtype)
        incoming = numpy.empty(largest, dst.dtype)
        sending = blocks[(self.rank - 1) % self.size]
        outgoing[:sending.size] = sending
        for step in range(self.size - 1):
            arriving = blocks[(self.rank - step - 2) % self.size]
            self._exchange(outgoing[:sending.size], incoming[:arriving.size])
            numpy.add(incoming[:arriving.size], arriving, out=outgoing[:arriving.size])
            sending = arriving
        dst[...] = outgoing[:dst.size]

    def _allgather(self, blocks):
        """N − 1 steps: at step t, send block (rank − t) mod N, complete here, to the right and
        receive block (rank − t − 1) mod N from the left, in place."""
        for step in range(self.size - 1):
            self._exchange(blocks[(self.rank - step) % self.size], blocks[(self.rank - step - 1) % self.size])

    def _exchange(self, send, receive):
        """One step: `send` to the right neighbour while `receive` arrives from the left."""
        mpi = self.group.mpi  # MPI keeps the messages between two ranks in order: no tags needed
        requests = [mpi.Irecv(receive, source=self.left), mpi.Isend(send, dest=self.right)]
        if watchdog.armed():
            watchdog.wait_for(lambda: load_mpi().Request.Testall(requests))
        else:
            load_mpi().Request.Waitall(requests)
        self.steps += 1
