"""ring-p2p and torus2d-p2p (point-to-point rings) against the native all-reduces under mpiexec:
one run per world size from 1 to 8 (tests/mpi/check_p2p_allreduce.py): exact on integers, to
rounding on floats, odd lengths, and step counts of 2(N−1) and 2(X−1)+2(Y−1), as the cost model
counts them."""
import pytest

from mpi.launch import run_checks

pytestmark = pytest.mark.slow  # every test runs under mpiexec


@pytest.mark.parametrize("ranks", range(1, 9))
def test_p2p_allreduces_equal_the_native_ones(ranks):
    assert run_checks("check_p2p_allreduce.py", ranks, timeout=90).startswith(f"{ranks} ranks passed")
