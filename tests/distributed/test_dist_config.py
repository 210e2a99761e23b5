"""Configuration of the distributed engine in one process: grids, errors a user can make, and a
communicator of one rank (no MPI), whose collectives are identities."""
import os
import subprocess
import sys

import numpy as np
import pytest

from minidl import distributed
from minidl.errors import UserError


def test_parse_shape():
    assert distributed.parse_shape("4x2") == (4, 2)
    assert distributed.parse_shape("1X6") == (1, 6)
    for bad in ("4", "4x", "0x2", "2x-1", "axb", "2x2x2"):
        with pytest.raises(UserError, match="write e.g. 4x2"):
            distributed.parse_shape(bad)


def test_square_grid_is_the_squarest_factorization():
    expected = {1: (1, 1), 2: (1, 2), 3: (1, 3), 4: (2, 2), 5: (1, 5), 6: (2, 3), 7: (1, 7), 8: (2, 4),
                12: (3, 4), 1088: (32, 34)}
    assert {n: distributed.square_grid(n) for n in expected} == expected


def test_wrong_configurations_name_the_fix(monkeypatch):
    comm = distributed.Communicator()
    assert (comm.rank, comm.size, comm.local_rank, comm.num_nodes) == (0, 1, 0, 1)
    with pytest.raises(UserError, match="has 4 ranks but the job has 1: use one of 1x1"):
        distributed.AllReduce(comm, "torus2d", (2, 2))
    with pytest.raises(UserError, match="choose one of ring, hierarchical, torus2d"):
        distributed.AllReduce(comm, "tree")
    with pytest.raises(UserError, match="only applies to torus2d"):
        distributed.AllReduce(comm, "ring", (1, 1))
    with pytest.raises(UserError, match="choose one of mpi, nccl"):
        distributed.Communicator("gloo")
    monkeypatch.setenv("MINIDL_RANKS_PER_NODE", "four")
    with pytest.raises(UserError, match="MINIDL_RANKS_PER_NODE"):
        distributed.Communicator()


def test_one_rank_needs_no_mpi():
    comm = distributed.init()
    assert comm.mpi is None and not distributed.launched_by_mpi()
    src, dst = np.arange(5.0), np.zeros(5)
    comm.reduce_scatter(src, dst)
    np.testing.assert_array_equal(dst, src)
    comm.allgather(src * 2, dst)
    np.testing.assert_array_equal(dst, src * 2)
    assert comm.start("allreduce", src, src).test()
    np.testing.assert_array_equal(comm.sum([3, 4]), [3, 4])
    for algorithm in distributed.ALGORITHMS:
        buffer = np.arange(7, dtype=np.float32)
        distributed.AllReduce(comm, algorithm)(buffer)
        np.testing.assert_array_equal(buffer, np.arange(7))
    with pytest.raises(ValueError, match="do not fit"):
        comm.reduce_scatter(np.zeros(4), np.zeros(3))


@pytest.mark.slow
def test_srun_tasks_that_mpi_does_not_join_are_refused():
    """Run apart: it initializes MPI, which this process must not (see the test above)."""
    pytest.importorskip("mpi4py", reason="pip install -e '.[test]' installs mpi4py")
    environment = dict(os.environ, SLURM_STEP_NUM_TASKS="4", MINIDL_DEVICE="cpu")
    result = subprocess.run([sys.executable, "-c", "from minidl import distributed; distributed.init()"],
                            env=environment, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "srun started 4 tasks but MPI sees each alone" in result.stderr
