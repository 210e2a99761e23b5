"""Collectives over NCCL (cupy.cuda.nccl) on CuPy arrays: one NCCL communicator per group.

All groups of one process share one communication stream that first waits for the compute
stream, so collectives read finished gradients and run in the order they were started without
host synchronization while backward goes on. With the watchdog armed the host polls each
collective against its deadline and can abort every NCCL communicator (never run on a GPU).

Details: docs/distributed.md, "minidl/distributed/nccl_transport.py".
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
