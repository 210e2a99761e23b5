"""The collectives and the three all-reduce algorithms under mpiexec, against closed forms.

One mpiexec run per world size from 1 to 8 (primes included); each checks every grid shape,
hierarchical groupings by MINIDL_RANKS_PER_NODE-style node sizes, odd lengths, float32 and
float64, every collective twice (tests/mpi/check_allreduce.py).
"""
import pytest

from mpi.launch import run_checks

pytestmark = pytest.mark.slow  # every test runs under mpiexec


@pytest.mark.parametrize("ranks", range(1, 9))
def test_allreduce_algorithms_sum_exactly(ranks):
    assert run_checks("check_allreduce.py", ranks, timeout=90).startswith(f"{ranks} ranks passed")


def test_nodes_from_the_environment():
    """MINIDL_RANKS_PER_NODE=3 makes 6 ranks on one machine two nodes of 3 for the world communicator."""
    last = run_checks("check_allreduce.py", 6, env={"MINIDL_RANKS_PER_NODE": "3"}, timeout=90)
    assert last.startswith("6 ranks passed")
