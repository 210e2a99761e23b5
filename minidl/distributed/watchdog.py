"""A deadline on every wait for other ranks, and a heartbeat that tells who is where.

Once armed (several ranks), every wait on the others is a non-blocking request tested against
a deadline: past `warning` seconds rank 0 names whom it waits for, past `timeout` the job aborts
with one line naming the stalled ranks. A heartbeat thread on each rank tells rank 0 its step
and activity, so a stopped rank falls silent while a busy one keeps beating. With one rank
every call here is a no-op.

Details: docs/distributed.md, "minidl/distributed/watchdog.py".
"""
import atexit
import sys
import threading
import time

from minidl.distributed.launch import load_mpi

TICK_SECONDS = 0.05
HEARTBEAT_SECONDS = 0.5
SILENT_SECONDS = 2.5  # five heartbeats missed
GRACE_SECONDS = 5.0  # how much later than rank 0's the other ranks' deadline comes
SPIN_SECONDS, FIRST_NAP, LONGEST_NAP = 0.01, 5e-5, 1e-3
TAG = 1

_armed = None


def armed():
    """Whether waits have deadlines now."""
    return _armed is not None


def at_step(step):
    """This rank now works on optimizer step `step` (counted from 1)."""
    if _armed is not None:
        _armed.step = step


def doing(activity):
    """What this rank does now (data, forward, backward, update, checkpoint, eval; waits name their bucket)."""
    if _armed is not None:
        _armed.activity = activity


def wait_for(test):
    """Call `test()` until it is true, within the deadline (or at once, unarmed: then it must be true)."""
    if _armed is not None:
        _armed.wait_for(test)
    elif not test():
        raise RuntimeError("wait_for without an armed watchdog: use the request's own blocking wait")


def arm(world, timeout, warning, ranks):
    """Give this rank's waits deadlines: `timeout` seconds (0: none), a warning after `warning`
    (0: none); `ranks` is every rank's {"rank", "host", "pid"}. Collective; inert with one rank
    or with both 0."""
    global _armed
    disarm()
    if world.size > 1 and (timeout or warning):
        _armed = Watchdog(world, timeout, warning, ranks)


def load():
    """(heartbeat messages this rank has received, CPU seconds of its heartbeat thread) since it was armed."""
    return (_armed.received, _armed.thread_seconds) if _armed is not None else (0, 0.0)


def disarm():
    global _armed
    if _armed is not None:
        _armed.stop()
        _armed = None


class Watchdog:
    def __init__(self, world, timeout, warning, ranks):
        MPI = load_mpi()
        self.world, self.timeout, self.warning, self.ranks = world, timeout, warning, ranks
        self.rank = world.rank
        self.deadline = timeout + (GRACE_SECONDS if self.rank else 0.0)
        self.step, self.activity, self.waiting = 0, "start", False
        self.resumed = time.monotonic()  # start, or the end of this rank's own latest stop
        self.seen = {}  # rank -> (monotonic time heard, step, activity, waiting)
        self.received, self.thread_seconds = 0, 0.0  # heartbeat messages received, the thread's CPU time
        self.watched = range(1, world.size) if self.rank == 0 else [0]
        self.threaded = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self.side = world.mpi.Dup()
        self._stopping = threading.Event()
        self._thread = None
        if self.threaded:
            self._thread = threading.Thread(target=self._beat, name="minidl-heartbeat", daemon=True)
            self._thread.start()
            atexit.register(self.stop)  # before MPI finalizes (atexit runs the later-registered first)

    # --- the heartbeat thread ----------------------------------------------------------------

    def _beat(self):
        MPI, status = load_mpi(), load_mpi().Status()
        monitor = 1 if self.rank == 0 else 0
        told, told_at, sent = None, 0.0, None
        while not self._stopping.wait(TICK_SECONDS):
            news, now = (self.step, self.activity, self.waiting), time.monotonic()
            # at most one send in flight: a stopped monitor costs nothing
            if (news != told or now - told_at >= HEARTBEAT_SECONDS) and (sent is None or sent.Test()):
                sent, told, told_at = self.side.isend(news, monitor, TAG), news, now
            while self.side.iprobe(MPI.ANY_SOURCE, TAG, status):
                source = status.Get_source()
                self.seen[source] = (time.monotonic(), *self.side.recv(source=source, tag=TAG))
                self.received += 1
            self.thread_seconds = time.thread_time()

    def stop(self):
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    # --- waits ---------------------------------------------------------------------------------

    def wait_for(self, test):
        if test():
            return
        start, nap, warned = time.monotonic(), FIRST_NAP, False
        last = start
        self.waiting = True
        try:
            while not test():
                now = time.monotonic()
                if now - start > SPIN_SECONDS:
                    time.sleep(nap)
                    nap = min(2 * nap, LONGEST_NAP)
                    now = time.monotonic()
                if now - last > SILENT_SECONDS / 2:  # this rank was stopped itself: that is no wait
                    start += now - last
                    self.resumed = now
                last = now
                waited = now - start
                if self.warning and not warned and waited >= self.warning:
                    warned = True
                    self._warn(waited)
                if self.timeout and waited >= self.deadline:
                    self._abort(waited)
        finally:
            self.waiting = False

    def elsewhere(self):
        """[(rank, description)] of the watched ranks not waiting where this rank waits."""
        now, found = time.monotonic(), []
        for rank in self.watched:
            heard, step, activity, waiting = self.seen.get(rank, (0.0, 0, "start", False))
            silent = now - max(heard, self.resumed)  # while this rank was stopped it heard nothing
            where = f"{'waiting in' if waiting else 'in'} {activity} at step {step}"
            if silent >= SILENT_SECONDS:
                found.append((rank, f"stopped: no heartbeat for {silent:.1f} s, last seen {where}"))
            elif not (waiting and step == self.step and activity == self.activity):
                found.append((rank, f"alive {now - heard:.1f} s ago, {where}"))
        return found

    def _named(self, found):
        return "; ".join(f"rank {rank} (pid {self.ranks[rank]['pid']} on {self.ranks[rank]['host']}; {what})"
                         for rank, what in found)

    def _here(self, waited):
        return f"rank {self.rank} has waited {waited:.1f} s in {self.activity} at step {self.step}"

    def _warn(self, waited):
        """Rank 0 names whom it waits for; its deputy speaks only of a silent rank 0."""
        found = self.elsewhere() if self.threaded else []
        if self.rank == 0 and found or self.rank == 1 and any(what.startswith("stopped") for _, what in found):
            print(f"\nminidl: stall warning: {self._here(waited)} for {self._named(found)}", file=sys.stderr,
                  flush=True)

    def _abort(self, waited):
        if not self.threaded:
            whom = "no rank can be named (MPI without thread support: no heartbeats)"
        else:
            found = self.elsewhere()
            stopped = [entry for entry in found if entry[1].startswith("stopped")]
            whom = (f"stalled: {self._named(stopped or found)}" if found else
                    "rank 0 waits too (the stalled rank is one rank 0 did not hear from)")
        print(f"\nminidl: collective timeout (--collective-timeout {self.timeout:g}): {self._here(waited)}; "
              f"{whom}; aborting the job", file=sys.stderr, flush=True)
        self.world.abort(1)
