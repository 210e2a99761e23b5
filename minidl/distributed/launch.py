"""Whether this process is a rank of an MPI job, and the way to MPI (mpi4py, imported lazily:
a single process never needs it)."""
import os
import sys

from minidl.errors import UserError
from minidl.launchers import LAUNCHER_VARIABLES, srun_tasks


def launched_by_mpi():
    """Whether this process is one rank of an MPI job (else it runs alone, without MPI).

    `python -m mpi4py` counts as launched: it has initialized MPI already; so does a task of
    an srun step of several tasks."""
    return ("mpi4py.MPI" in sys.modules or any(name in os.environ for name in LAUNCHER_VARIABLES)
            or srun_tasks() > 1)


def check_world_size(size):
    """Refuse N copies of a 1-rank job: srun started tasks that MPI does not join."""
    if size == 1 and srun_tasks() > 1:
        raise UserError(f"srun started {srun_tasks()} tasks but MPI sees each alone: run "
                        "srun --mpi=pmix (or pmi2) with an MPI built for Slurm, or start the job with mpirun")


def load_mpi():
    """The mpi4py.MPI module (initializing MPI on first use), or a UserError saying how to get it."""
    try:
        from mpi4py import MPI
    except ImportError as error:
        raise UserError(f"this is an MPI job but mpi4py cannot be imported ({error}): "
                        "pip install mpi4py mpich (or the extra: pip install 'minidl[mpi]')") from None
    return MPI
