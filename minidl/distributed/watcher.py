"""Naming a rank that dies without a word (killed by the OOM killer, a segfault, `kill -9`).

Such a rank runs no Python on its way out, and the launcher may report some other PID. So every
rank of a multi-rank job forks a tiny watcher process that blocks reading a pipe from its rank:
a rank that exits writes one byte first; when the pipe just closes, the watcher names the dead
rank on stderr. It touches neither MPI nor CUDA, so it is safe to fork after either.

Details: docs/distributed.md, "minidl/distributed/watcher.py".
"""
import atexit
import os
import signal
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
    stops = {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}  # a scheduler's stop is the rank's to answer
    # blocked across the fork, so a stop sent at once cannot reach the watcher before it ignores it
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    if os.fork() == 0:  # the watcher
        os.close(write_end)
        os.setsid()  # out of the rank's process group: the launcher's kill of the rank spares it
        for signum in stops:
            signal.signal(signum, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        news = os.read(read_end, 1)
        if not news:
            os.write(2, note.encode())
        os._exit(0)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(read_end)
    _pipe = write_end
    atexit.register(disarm)


def disarm():
    """Tell the watcher this rank ends on purpose (a normal exit, or an abort it reported itself)."""
    global _pipe
    if _pipe is not None:
        try:
            os.write(_pipe, b"x")
        except BrokenPipeError:  # the watcher is gone (a kill of the whole job): nobody to tell
            pass
        os.close(_pipe)
        _pipe = None
