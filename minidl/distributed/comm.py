"""`Communicator`: a group of ranks, where they sit (nodes), and collectives on xp arrays.

It wraps an mpi4py communicator and adds node grouping (`local_rank` selects the GPU), SUM
collectives on contiguous arrays, blocking or not, and on a few numbers and Python objects,
deadlines when the watchdog is armed, the choice of transport (MPI or NCCL), and `split` /
`dup`. With one rank it needs no MPI and every collective is an identity, so single-process
code runs the same calls; otherwise every rank of the group calls collectives in the same order.

Details: docs/distributed.md, "minidl/distributed/comm.py".
"""
import functools
import os
import pickle
import sys
import time

import numpy

from minidl import environment
from minidl.backend import on_gpu, select_device
from minidl.distributed import watchdog, watcher
from minidl.distributed.launch import check_world_size, launched_by_mpi, load_mpi
from minidl.distributed.mpi_transport import MpiTransport
from minidl.distributed.nccl_transport import NcclTransport, abort_nccl
from minidl.errors import UserError

BACKENDS = ("mpi", "nccl")
OPERATIONS = ("allreduce", "reduce_scatter", "allgather", "bcast")
FORWARD_SECONDS, ABORT_PAUSE_SECONDS = 0.5, 5


class Communicator:
    def __init__(self, backend="mpi", ranks_per_node=None):
        """The world: every rank of the job when an MPI launcher started this process, else this
        process alone. Binds the process to GPU `local_rank % device_count` (a no-op on CPU)
        before any NCCL communicator exists. `ranks_per_node` (default: $MINIDL_RANKS_PER_NODE,
        else the real nodes) groups consecutive ranks into nodes."""
        if backend not in BACKENDS:
            raise UserError(f"communication backend {backend!r} does not exist: choose one of {', '.join(BACKENDS)}")
        self.backend = backend
        self.ranks_per_node = _ranks_per_node(ranks_per_node)
        self._attach(load_mpi().COMM_WORLD if launched_by_mpi() else None)
        check_world_size(self.size)
        select_device(self.local_rank)
        self._nccl = _world_nccl(self) if backend == "nccl" and self.size > 1 else None

    def _attach(self, mpi_comm):
        self.mpi = mpi_comm
        self.rank = mpi_comm.Get_rank() if mpi_comm is not None else 0
        self.size = mpi_comm.Get_size() if mpi_comm is not None else 1
        self._mpi = MpiTransport(mpi_comm) if self.size > 1 else None

    def _child(self, mpi_comm, nccl):
        child = object.__new__(Communicator)
        child.backend, child.ranks_per_node = self.backend, self.ranks_per_node
        child._attach(mpi_comm)
        child._nccl = nccl if child.size > 1 else None
        return child

    def __repr__(self):
        return f"Communicator(rank {self.rank} of {self.size}, backend {self.backend})"

    # --- groups ----------------------------------------------------------------------------

    def split(self, color, key):
        """The sub-communicator of the ranks that pass the same `color`, ordered by `key`."""
        if self.size == 1:
            return self
        sub = self.mpi.Split(color, key)
        nccl = self._nccl.for_group(sub) if self._nccl is not None and sub.Get_size() > 1 else None
        return self._child(sub, nccl)

    def dup(self):
        """The same ranks on a separate channel: its collectives never match this one's."""
        if self.size == 1:
            return self
        return self._child(self.mpi.Dup(), self._nccl)

    @functools.cached_property
    def _node(self):
        """(node communicator over MPI, node index, number of nodes)."""
        if self.size == 1:
            return None, 0, 1
        if self.ranks_per_node:
            node_mpi = self.mpi.Split(self.rank // self.ranks_per_node, self.rank)
        else:
            node_mpi = self.mpi.Split_type(load_mpi().COMM_TYPE_SHARED, key=self.rank)
        first = node_mpi.bcast(self.rank, root=0)  # a node is named by its lowest rank
        firsts = sorted(set(self.mpi.allgather(first)))
        return node_mpi, firsts.index(first), len(firsts)

    local_rank = property(lambda self: self._node[0].Get_rank() if self.size > 1 else 0)
    local_size = property(lambda self: self._node[0].Get_size() if self.size > 1 else 1)
    node = property(lambda self: self._node[1])
    num_nodes = property(lambda self: self._node[2])

    @functools.cached_property
    def node_comm(self):
        """The ranks on this rank's node, ordered by rank."""
        node_mpi = self._node[0]
        if node_mpi is None or node_mpi.Get_size() == 1:
            return self._child(None, None)
        return self._child(node_mpi, self._nccl.for_group(node_mpi) if self._nccl is not None else None)

    @functools.cached_property
    def cross_node_comm(self):
        """The ranks with this rank's local rank, one per node, ordered by node."""
        return self.split(self.local_rank, self.node)

    # --- collectives -----------------------------------------------------------------------

    def allreduce(self, buffer):
        """buffer ← the elementwise SUM of every rank's buffer."""
        self.run("allreduce", buffer, buffer)

    def reduce_scatter(self, src, dst):
        """dst ← the SUM over ranks of block `rank` of src (src holds `size` blocks of len(dst))."""
        self.run("reduce_scatter", src, dst)

    def allgather(self, src, dst):
        """dst ← every rank's src, in rank order (dst holds `size` blocks of len(src))."""
        self.run("allgather", src, dst)

    def bcast(self, buffer, root=0):
        """buffer ← rank `root`'s buffer."""
        self.run("bcast", buffer, buffer, root)

    def start(self, op, src, dst, root=0):
        """Begin collective `op` (one of OPERATIONS) without blocking; returns its request, whose
        `test()` says whether a collective that depends on the result may start now and whose
        `wait()` completes it. The arrays must stay untouched until then. allreduce and bcast
        work in place: pass the buffer as both src and dst."""
        transport = self._transport(op, src, dst)
        return transport.start(op, src, dst, root) if transport is not None else DONE

    def run(self, op, src, dst, root=0):
        """Collective `op` as `start` describes it, blocking until it is complete (within the
        watchdog's deadline where one is armed)."""
        transport = self._transport(op, src, dst)
        if transport is None:
            return
        if watchdog.armed():
            transport.start(op, src, dst, root).wait()
        else:
            transport.run(op, src, dst, root)

    def _transport(self, op, src, dst):
        """Who carries this collective: None when this rank is alone (then it is done here)."""
        check_arguments(op, src, dst, self.size)
        if self.size == 1:
            if dst is not src:
                dst[...] = src
            return None
        return self._nccl if self._on_nccl(dst) else self._mpi

    def _on_nccl(self, buffer):
        return self._nccl is not None and not isinstance(buffer, numpy.ndarray)

    def stream_for(self, buffer):
        """The device stream that collectives on `buffer` run on (NCCL's), or None where the
        host carries them (MPI, or this rank alone)."""
        return self._nccl.stream if self.size > 1 and self._on_nccl(buffer) else None

    def sum(self, values):
        """The SUM over ranks of a few numbers (losses, counts), as a float64 NumPy array."""
        total = numpy.array(values, dtype=numpy.float64).reshape(-1)
        self.allreduce(total)
        return total

    def allgather_values(self, values):
        """Every rank's few numbers, as a float64 NumPy array of one row per rank."""
        mine = numpy.array(values, dtype=numpy.float64).reshape(-1)
        rows = numpy.empty((self.size, mine.size))
        self.allgather(mine, rows.reshape(-1))
        return rows

    def allgather_object(self, value):
        """Every rank's `value` (any picklable object), in rank order."""
        if self.size == 1:
            return [value]
        if not watchdog.armed():
            return self.mpi.allgather(value)
        # MPI has no non-blocking collectives of Python objects: the pickles' sizes, then their bytes
        mine = numpy.frombuffer(pickle.dumps(value), numpy.uint8)
        sizes = numpy.empty(self.size, numpy.int64)
        self._wait(self.mpi.Iallgather(numpy.array([mine.size], numpy.int64), sizes))
        offsets = numpy.concatenate([[0], numpy.cumsum(sizes)])
        everyone = numpy.empty(offsets[-1], numpy.uint8)
        self._wait(self.mpi.Iallgatherv(mine, [everyone, (sizes.tolist(), offsets[:-1].tolist()),
                                               load_mpi().BYTE]))
        return [pickle.loads(everyone[start:stop].tobytes()) for start, stop in zip(offsets, offsets[1:])]

    def gather_object(self, value, root=0):
        """On rank `root`, every rank's `value` in rank order; None on the others."""
        if self.size == 1:
            return [value]
        if not watchdog.armed():
            return self.mpi.gather(value, root=root)
        everyone = self.allgather_object(value)
        return everyone if self.rank == root else None

    def barrier(self):
        if self.size == 1:
            return
        if watchdog.armed():
            self._wait(self.mpi.Ibarrier())
        else:
            self.mpi.Barrier()

    @staticmethod
    def _wait(request):
        """Complete an MPI request within the watchdog's deadline."""
        watchdog.wait_for(request.Test)

    def abort(self, code=1):
        """End every rank of the job now with exit status `code` (stdio flushed first)."""
        sys.stdout.flush()
        sys.stderr.flush()
        watcher.disarm()  # ending on purpose: not a silent death
        abort_nccl()  # no kernel left waiting on a peer (ncclCommAbort)
        if self.mpi is not None:
            time.sleep(FORWARD_SECONDS)  # the launcher forwards what this rank wrote before it kills
            load_mpi().COMM_WORLD.Abort(code)
            # MPI_Abort has asked the launcher to end every rank, and may return (MPICH's does with
            # a second thread in MPI): the launcher's kill comes during this pause
            time.sleep(ABORT_PAUSE_SECONDS)
        os._exit(code)


class _Done:
    """The request of a collective that was complete when it started (one rank)."""

    def test(self):
        return True

    def wait(self):
        pass


DONE = _Done()


def check_arguments(op, src, dst, size):
    if op not in OPERATIONS:
        raise ValueError(f"unknown collective {op!r}: choose one of {', '.join(OPERATIONS)}")
    if src.dtype != dst.dtype:
        raise ValueError(f"{op}: source {src.dtype} and destination {dst.dtype} differ")
    for array in (src, dst):
        if not array.flags.c_contiguous:
            raise ValueError(f"{op}: collectives need contiguous arrays")
    expected = {"reduce_scatter": (dst.size * size, dst.size), "allgather": (src.size, src.size * size)}
    if op in expected and (src.size, dst.size) != expected[op]:
        raise ValueError(f"{op} over {size} ranks: source of {src.size} and destination of "
                         f"{dst.size} elements do not fit")
    if op in ("allreduce", "bcast") and dst is not src:
        raise ValueError(f"{op} works in place: pass the same array as source and destination")


def _ranks_per_node(value):
    """The node grouping override: an argument, else $MINIDL_RANKS_PER_NODE, else None (real nodes)."""
    if value is None:
        return environment.value("MINIDL_RANKS_PER_NODE")
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"ranks per node must be a positive integer, not {value!r}")
    return value


def _world_nccl(comm):
    if not on_gpu:
        raise UserError("the nccl backend needs CuPy and a GPU on every rank: install cupy-cuda12x/13x "
                        "on GPU nodes, or use the mpi backend")
    return NcclTransport(comm.mpi)
