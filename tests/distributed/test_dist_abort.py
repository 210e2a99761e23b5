"""A failing rank ends the whole job quickly, with a non-zero status, naming the rank."""
import time

from mpi.launch import run


def test_an_exception_on_one_rank_aborts_every_rank():
    start = time.monotonic()
    result = run("check_abort.py", 4, 2, timeout=60)
    seconds = time.monotonic() - start
    assert result.returncode != 0, result.stdout
    assert "minidl: rank 2 of 4 failed" in result.stderr
    assert "RuntimeError: a deliberate failure" in result.stderr
    assert "no rank failed" not in result.stdout
    assert seconds < 30, f"the job took {seconds:.0f} s to end"
