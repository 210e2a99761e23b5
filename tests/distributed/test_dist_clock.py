"""Clock offsets between ranks by ping-pong with rank 0 (tests/mpi/check_clock.py), against the
known offsets of deliberately shifted clocks."""
import pytest

from mpi.launch import run_checks

pytestmark = pytest.mark.slow  # runs under mpiexec


def test_offsets_from_rank_0_lie_within_their_uncertainty():
    assert run_checks("check_clock.py", 3, timeout=60).startswith("3 ranks passed")
