"""Joining the job: the world communicator, abort on failure, the initial broadcast.

`init()` is the trainer's one call at start: it returns the world `Communicator` (every rank
of the job when an MPI launcher started this process, else this process alone, which needs
no MPI at all), binds the process to GPU `local_rank % device_count`, and makes an uncaught
exception on any rank abort the whole job instead of leaving the other ranks waiting in a
collective forever, and starts the watcher that names a rank dying without a word.
"""
import sys

from minidl.distributed import watcher
from minidl.distributed.comm import Communicator


def install_abort_hook(comm):
    """Make an uncaught exception on this rank print its traceback under a line naming the rank,
    then abort every rank of the job (MPI_Abort, exit code 1): never a hang."""
    previous = sys.excepthook

    def abort_job(kind, value, traceback):
        watcher.disarm()  # this rank says itself why it ends
        sys.stderr.write(f"minidl: rank {comm.rank} of {comm.size} failed; aborting the job\n")
        previous(kind, value, traceback)
        comm.abort(1)

    sys.excepthook = abort_job


def init(backend="mpi", ranks_per_node=None):
    """The world communicator for a training run (see the package docstring for the call order)."""
    comm = Communicator(backend, ranks_per_node=ranks_per_node)
    if comm.mpi is not None:
        install_abort_hook(comm)
        watcher.watch(comm.rank, comm.size)
    return comm


def broadcast_state(comm, arrays, root=0):
    """Overwrite each array in place with rank `root`'s values: parameters and BN buffers at start
    (pass `model.state_dict().values()`), so that every rank begins from the same model."""
    for array in arrays:
        comm.bcast(array, root)
