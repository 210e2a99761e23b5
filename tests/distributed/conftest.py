"""Fixtures of the distributed tests: several hosts on one machine (tests/mpi/hosts.py)."""
import pytest

from mpi import hosts


@pytest.fixture
def cluster(tmp_path):
    """make(hosts=2) -> a hosts.Cluster whose shared folder is tmp_path/"shared"; every cluster is
    removed when the test ends, however it ends (a failure, pytest-timeout's exception)."""
    reason = hosts.unavailable()
    if reason:
        pytest.skip(reason)
    made = []

    def make(count=2):
        shared = tmp_path / "shared"
        shared.mkdir(exist_ok=True)
        made.append(hosts.Cluster(shared, count))
        return made[-1]

    yield make
    for each in made:
        each.close()
