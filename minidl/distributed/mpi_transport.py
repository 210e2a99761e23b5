"""Collectives over MPI (mpi4py) on NumPy arrays, and on CuPy arrays one of two ways.

A CUDA-aware MPI gets the CuPy array itself; otherwise the data is staged through host memory
(`MINIDL_CUDA_AWARE_MPI=1|0` overrides the detection). Blocking calls use MPI's tuned blocking
collectives, `start` the non-blocking ones, whose waits the watchdog can put a deadline on.

Details: docs/distributed.md, "minidl/distributed/mpi_transport.py".
"""
import ctypes
import functools

import numpy

from minidl import environment
from minidl.distributed import watchdog
from minidl.distributed.launch import load_mpi


@functools.cache
def cuda_aware():
    """Whether MPI can take device pointers."""
    forced = environment.value("MINIDL_CUDA_AWARE_MPI")
    if forced is not None:
        return forced
    try:  # the mpi4py extension module resolves the symbol through the libmpi it links
        query = ctypes.CDLL(load_mpi().__file__).MPIX_Query_cuda_support
    except (OSError, AttributeError):
        return False
    return bool(query())


class MpiTransport:
    def __init__(self, mpi_comm):
        self.comm = mpi_comm
        self.MPI = load_mpi()

    def run(self, op, src, dst, root=0):
        send, recv, copy_back = self._stage(src, dst)
        self._call(op, send, recv, root, blocking=True)
        copy_back()

    def start(self, op, src, dst, root=0):
        send, recv, copy_back = self._stage(src, dst)
        return MpiRequest(self._call(op, send, recv, root, blocking=False), copy_back)

    def _stage(self, src, dst):
        """(what MPI sends, where MPI receives, what to do once it has)."""
        if isinstance(dst, numpy.ndarray):
            return src, dst, _nothing
        import cupy
        cupy.cuda.get_current_stream().synchronize()  # the data MPI reads must be complete
        if cuda_aware():
            return src, dst, _nothing
        send = src.get()
        recv = send if dst is src else numpy.empty(dst.shape, dst.dtype)
        return send, recv, functools.partial(dst.set, recv)

    def _call(self, op, send, recv, root, blocking):
        comm, MPI = self.comm, self.MPI
        if op == "allreduce":
            call = comm.Allreduce if blocking else comm.Iallreduce
            return call(MPI.IN_PLACE if send is recv else send, recv, op=MPI.SUM)
        if op == "reduce_scatter":
            call = comm.Reduce_scatter_block if blocking else comm.Ireduce_scatter_block
            return call(send, recv, op=MPI.SUM)
        if op == "allgather":
            return (comm.Allgather if blocking else comm.Iallgather)(send, recv)
        return (comm.Bcast if blocking else comm.Ibcast)(recv, root=root)


def _nothing():
    pass


class MpiRequest:
    def __init__(self, request, copy_back):
        self.request, self.copy_back = request, copy_back

    def test(self):
        if self.copy_back is not None and self.request.Test():
            self._finish()
        return self.copy_back is None

    def wait(self):
        if self.copy_back is None:
            return
        if watchdog.armed():
            watchdog.wait_for(self.request.Test)
        else:
            self.request.Wait()
        self._finish()

    def _finish(self):
        copy_back, self.copy_back = self.copy_back, None
        copy_back()
