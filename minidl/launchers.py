"""What a launcher (mpiexec, srun) tells a process through its environment, read without importing
the engine: the command lines' error handler (minidl.cli) needs it before anything else loads.
"""
import os

# Set by the launchers that start MPI processes: MPICH's hydra, Intel MPI and srun --mpi=pmi2
# (PMI_RANK), PMIx-based ones such as Open MPI 5 and srun --mpi=pmix (PMIX_RANK), Open MPI 4
# (OMPI_COMM_WORLD_RANK), MVAPICH2 (MV2_COMM_WORLD_RANK).
LAUNCHER_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")


def srun_tasks():
    """How many tasks the enclosing srun step started (1 outside srun)."""
    value = os.environ.get("SLURM_STEP_NUM_TASKS", "1")
    return int(value) if value.isdigit() else 1


def launcher_rank():
    """This process's rank as its launcher numbered it (srun's task number included), 0 where none did."""
    for name in (*LAUNCHER_VARIABLES, "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0
