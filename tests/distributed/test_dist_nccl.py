"""NCCL set-up logic without a GPU (tests/mpi/check_nccl_setup.py): one NCCL communicator per
group, made from the unique id its rank 0 created; a clear error where CuPy has no GPU."""
import pytest

from mpi.launch import run_checks

pytestmark = pytest.mark.slow  # runs under mpiexec


def test_nccl_communicators_per_group():
    assert run_checks("check_nccl_setup.py", 3, timeout=60).startswith("3 ranks passed")
