"""Data-parallel training under mpiexec (tests/mpi/check_training.py): overlapped = plain
reduction bit for bit on ResNet-20 and on a model with a layer used twice; N ranks × batch b
= 1 rank × batch N·b after several SGD steps; per-rank BN statistics; rank 0's initial state."""
import pytest

from mpi.launch import run_checks

pytestmark = pytest.mark.slow  # every test trains under mpiexec


@pytest.mark.parametrize("ranks", [1, 2, 4, 6, 8])
def test_data_parallel_training(ranks):
    assert run_checks("check_training.py", ranks, timeout=120).startswith(f"{ranks} ranks passed")
