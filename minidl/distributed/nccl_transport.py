"""Collectives over NCCL (cupy.cuda.nccl) on CuPy arrays: one NCCL communicator per group.

Creation: the group's rank 0 makes a unique id, MPI broadcasts it, and every member calls
ncclCommInitRank with it, which blocks until the whole group has joined. The process's GPU
must be selected before (the world Communicator does that), since an NCCL communicator is
bound to the current device.

Ordering: all groups of one process share ONE communication stream. A collective first makes
that stream wait for the work queued so far on the current (compute) stream, so it reads
finished gradients; the collectives queued on the shared stream then run in the order they
were started, which keeps a chain such as reduce-scatter -> all-reduce -> all-gather in order
without host synchronization, and lets backward continue on the compute stream meanwhile.
`wait()` makes the compute stream wait for the collective; the host never blocks, except with
the watchdog armed (minidl.distributed.watchdog): then the host polls the collective's event
against the deadline first, and `abort_nccl()` aborts every NCCL communicator of the process
(ncclCommAbort) before the job ends, so no kernel is left waiting for a stopped peer. The
watchdog's part of this file has never run on a GPU.
"""
from minidl.distributed import watchdog

_communicators = []  # every NCCL communicator this process joined, for abort_nccl


def _default_nccl():
    from cupy.cuda import nccl
    return nccl


class NcclTransport:
    def __init__(self, mpi_comm, stream=None, nccl=None):
        """Join the NCCL communicator of `mpi_comm`'s group (collective over that group)."""
        self.nccl = nccl or _default_nccl()
        if stream is None:
            import cupy
            stream = cupy.cuda.Stream(non_blocking=True)
        self.stream = stream
        unique_id = self.nccl.get_unique_id() if mpi_comm.Get_rank() == 0 else None
        unique_id = mpi_comm.bcast(unique_id, root=0)
        self.comm = self.nccl.NcclCommunicator(mpi_comm.Get_size(), unique_id, mpi_comm.Get_rank())
        _communicators.append(self.comm)

    def for_group(self, mpi_comm):
        """The transport of a sub-group (a new NCCL communicator on the same stream)."""
        return NcclTransport(mpi_comm, self.stream, self.nccl)

    def run(self, op, src, dst, root=0):
        self.start(op, src, dst, root).wait()

    def start(self, op, src, dst, root=0):
        import cupy
        produced = cupy.cuda.Event(disable_timing=True)
        produced.record(cupy.cuda.get_current_stream())
        self.stream.wait_event(produced)
        self._enqueue(op, src, dst, root)
        done = cupy.cuda.Event(disable_timing=True)
        done.record(self.stream)
        return NcclRequest(done)

    def _enqueue(self, op, src, dst, root):
        nccl, comm, stream = self.nccl, self.comm, self.stream.ptr
        dtype = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32,
                 "float64": nccl.NCCL_FLOAT64, "int32": nccl.NCCL_INT32,
                 "int64": nccl.NCCL_INT64}[src.dtype.name]
        send, recv = src.data.ptr, dst.data.ptr
        if op == "allreduce":
            comm.allReduce(send, recv, dst.size, dtype, nccl.NCCL_SUM, stream)
        elif op == "reduce_scatter":
            comm.reduceScatter(send, recv, dst.size, dtype, nccl.NCCL_SUM, stream)
        elif op == "allgather":
            comm.allGather(send, recv, src.size, dtype, stream)
        else:
            comm.bcast(recv, dst.size, dtype, root, stream)


class NcclRequest:
    def __init__(self, done):
        self.done = done

    def test(self):
        return True  # anything started next queues behind this collective on the shared stream

    def wait(self):
        import cupy
        if watchdog.armed():
            watchdog.wait_for(self.done.query)
        cupy.cuda.get_current_stream().wait_event(self.done)


def abort_nccl():
    """Abort every NCCL communicator of this process (the job is ending; kernels stop waiting)."""
    while _communicators:
        _communicators.pop().abort()
