"""Naming a rank that dies without a word (killed by the OOM killer, a segfault, `kill -9`).

Such a rank runs no Python on its way out, and MPICH's launcher then ends the job reporting
some PID, not necessarily the dead one's. So every rank of a multi-rank job forks a tiny
watcher process at start that blocks reading a pipe from its rank: when the rank exits
normally (or aborts the job itself, with its own message) it first writes one byte; when it
dies, the pipe just closes, and the watcher writes
    minidl: rank R of N (pid P on HOST) died without finishing: killed or crashed
to stderr. The first such line names the rank that failed; the launcher then kills the
others, and their watchers may follow with lines of their own.

The watcher only reads a pipe and writes one line: safe to fork from a process with threads
and an initialized MPI or CUDA, which it never touches.
"""
import atexit
import os
import socket

_pipe = None


def watch(rank, size):
    """Start this rank's watcher (multi-rank jobs on POSIX); `disarm()` runs at a normal exit."""
    global _pipe
    if size < 2 or not hasattr(os, "fork") or _pipe is not None:
        return
    # the line break first: a progress bar may hold the cursor mid-line
    note = f"\nminidl: rank {rank} of {size} (pid {os.getpid()} on {socket.gethostname()}) died without " \
           "finishing: killed or crashed\n"
    read_end, write_end = os.pipe()
    if os.fork() == 0:  # the watcher
        os.close(write_end)
        os.setsid()  # out of the rank's process group: the launcher's kill of the rank spares it
        news = os.read(read_end, 1)
        if not news:
            os.write(2, note.encode())
        os._exit(0)
    os.close(read_end)
    _pipe = write_end
    atexit.register(disarm)


def disarm():
    """Tell the watcher this rank ends on purpose (a normal exit, or an abort it reported itself)."""
    global _pipe
    if _pipe is not None:
        os.write(_pipe, b"x")
        os.close(_pipe)
        _pipe = None
