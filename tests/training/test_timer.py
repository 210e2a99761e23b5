"""The step timer: seconds per step of each phase since the last report and since the last epoch
report, and the communication (no phase: it overlaps them) beside them."""
import time

from minidl.training.timer import PHASES, StepTimer


def test_reports_per_step_with_the_communication_beside_the_phases():
    timer = StepTimer(lambda: None)
    for _ in range(2):
        timer.start()
        launched = time.perf_counter()  # a bucket leaves during backward
        timer.mark("backward")
        timer.mark("allreduce")
        timer.add_since("communication", launched)
        timer.end_step()
    recent = timer.report()
    assert set(recent) == set(PHASES) | {"communication"}
    assert recent["communication"] >= recent["allreduce"] > 0 and recent["forward"] == 0
    assert set(timer.report()) == set(PHASES)  # a new window, without communication so far
    assert timer.epoch_report() == recent  # the epoch's window saw the same two steps
