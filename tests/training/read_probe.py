"""Run a script (train.py) and record which training images this process reads, in order.

    python tests/training/read_probe.py TRAIN_DIR LOG_DIR STOP_AFTER SCRIPT [ARGS...]
    mpiexec -n N python -m mpi4py tests/training/read_probe.py ...

A Python audit hook sees every file the process opens; each one under TRAIN_DIR is appended
to LOG_DIR/reads-<pid>.txt (ranks.json maps the pid to its rank). With STOP_AFTER > 0 the
process sends itself SIGTERM when it opens its STOP_AFTER-th image, as a preemption would:
the run finishes that step and checkpoints. Nothing in minidl knows of this probe.
"""
import os
import runpy
import signal
import sys

train_dir, log_dir, stop_after, script, *args = sys.argv[1:]
train_dir, stop_after = os.path.abspath(train_dir) + os.sep, int(stop_after)
log = open(os.path.join(log_dir, f"reads-{os.getpid()}.txt"), "a", buffering=1)
reads = 0


def record(event, details):
    global reads
    if event == "open" and isinstance(details[0], str) and os.path.abspath(details[0]).startswith(train_dir):
        log.write(os.path.relpath(details[0], train_dir) + "\n")
        reads += 1
        if reads == stop_after:
            os.kill(os.getpid(), signal.SIGTERM)


sys.addaudithook(record)
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
