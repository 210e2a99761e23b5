"""The one-node Slurm cluster of the Slurm tests (tests/slurm/cluster.py), made once per session."""
import pytest

from slurm.cluster import SlurmCluster, unavailable


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A running SlurmCluster; stopped and removed at the session's end however the tests end.
    Skipped with one line where it cannot be made (not root, the packages missing)."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
