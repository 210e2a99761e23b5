"""A deadline on every wait for other ranks, and a heartbeat that tells who is where.

Once armed (several ranks), every wait on the others is a non-blocking request tested against
a deadline: past `warning` seconds rank 0 names whom it waits for, past `timeout` the job aborts
with one line naming the stalled ranks. A heartbeat thread on each rank writes its step and
activity to its node's board (shared memory: no message); a rank that has waited too long asks
the other nodes for their boards, so a stopped rank is told from a busy one and a node that
does not answer is unreachable. Nothing is sent while the job moves. One rank: all no-ops.

Details: docs/distributed.md, "minidl/distributed/watchdog.py".
"""
import atexit
import sys
import threading
import time

from minidl.distributed.board import NodeBoard, decode, encode, read
from minidl.distributed.launch import load_mpi

TICK_SECONDS = 0.05  # a heartbeat's period; also how often a rank answers the others
SILENT_SECONDS = 2.5  # a rank whose heartbeat is older is stopped
ANSWER_SECONDS = 2.5  # how long a survey waits for a node's answer before calling it unreachable
FALLBACK_SECONDS = 0.25  # when a survey also asks the other ranks of a node whose first rank is silent
GRACE_SECONDS = 5.0  # how much later than rank 0's the deputy's deadline comes, and the others' after it
SPIN_SECONDS, FIRST_NAP, LONGEST_NAP = 0.01, 5e-5, 1e-3
QUERY, ANSWER = 1, 2  # message tags on the watchdog's own duplicate of the world communicator
TOLD = 8  # ranks a line names at most

_armed = None


def armed():
    """Whether waits have deadlines now."""
    return _armed is not None


def at_step(step):
    """This rank now works on optimizer step `step` (counted from 1)."""
    if _armed is not None:
        _armed.step = step


def doing(activity):
    """What this rank does now: one of board.ACTIVITIES, a bucket as 'bucket k'."""
    if _armed is not None:
        _armed.activity = encode(activity)


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


def survey():
    """{rank: board.Seen} of every rank, as a stalled wait would see them (None unarmed)."""
    return _armed.survey(range(_armed.world.size)) if _armed is not None else None


def load():
    """(watchdog messages this rank has received, CPU seconds of its heartbeat thread) since it was armed."""
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
        node = world.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)  # the ranks that share memory
        self.node_of = world.mpi.allgather(node.bcast(self.rank))  # a node is named by its first rank
        self.board = NodeBoard(node, self.rank)
        # rank 0 ends a stalled job; its deputy if rank 0 cannot, the first rank on another node (rank 1 on one node)
        self.deputy = next((r for r in range(world.size) if self.node_of[r] != self.node_of[0]), 1)
        self.deadline = timeout + GRACE_SECONDS * (0 if self.rank == 0 else 1 if self.rank == self.deputy else 2)
        self.step, self.activity, self.waiting = 0, encode("start"), False
        self.received, self.thread_seconds = 0, 0.0
        self.threaded = MPI.Query_thread() == MPI.THREAD_MULTIPLE  # else only the main thread may call MPI
        self.side = world.mpi.Dup()
        self.surveys = 0
        self._answers, self._queries = [], []  # sends not yet known complete (never waited for), per thread
        self._answered = time.monotonic()
        self._stopping = threading.Event()
        self.board.write(self.step, self.activity, self.waiting)
        self._thread = threading.Thread(target=self._beat, name="minidl-heartbeat", daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # before MPI finalizes (atexit runs the later-registered first)
        if not self.threaded and self.rank == 0:
            print("minidl: MPI gives this job no MPI_THREAD_MULTIPLE: the watchdog answers other nodes only while "
                  "a rank waits, so a node whose ranks are all busy may be named unreachable; use an MPI built "
                  "with thread support to tell them apart", file=sys.stderr, flush=True)

    # --- the heartbeat thread: this rank's row of its node's board; answers where MPI lets it ---------

    def _beat(self):
        while not self._stopping.wait(TICK_SECONDS):
            self.board.write(self.step, self.activity, self.waiting)
            if self.threaded:
                self._answer()
            self.thread_seconds = time.thread_time()

    def _answer(self):
        """Send this node's board to every rank that asked for it."""
        status = load_mpi().Status()
        while self.side.iprobe(load_mpi().ANY_SOURCE, QUERY, status):
            asker = status.Get_source()
            survey = self.side.recv(source=asker, tag=QUERY)
            self.received += 1
            self._answers.append(self.side.isend((survey, self.board.snapshot()), asker, ANSWER))
        self._answers = [request for request in self._answers if not request.Test()]
        self._answered = time.monotonic()

    def stop(self):
        self._stopping.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
            MPI = load_mpi()
            while self.side.iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG):  # late answers: none left unread
                self.side.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)

    # --- surveys: the boards of other nodes --------------------------------------------------------

    def survey(self, ranks):
        """{rank: board.Seen} of `ranks` as their nodes' boards show them: this node's read here, each
        other node's asked of its first rank, and FALLBACK_SECONDS later of its other ranks if that one
        has not answered (any may: they read the same board); a rank missing from the result is on a
        node that did not answer within ANSWER_SECONDS."""
        self.surveys += 1
        ranks = set(ranks)
        seen = {r: s for r, s in read(self.board.snapshot()).items() if r in ranks}
        nodes = {self.node_of[r] for r in ranks} - {self.node_of[self.rank]}
        self._ask(nodes)  # a node is named by its first rank
        status, start = load_mpi().Status(), time.monotonic()
        fallen_back = False
        while nodes and time.monotonic() < start + ANSWER_SECONDS:
            if not fallen_back and time.monotonic() >= start + FALLBACK_SECONDS:
                fallen_back = True
                self._ask([r for r in range(self.world.size) if self.node_of[r] in nodes and r not in nodes])
            if not self.threaded:
                self._answer()  # two ranks may survey each other
            while self.side.iprobe(load_mpi().ANY_SOURCE, ANSWER, status):
                source = status.Get_source()
                survey, rows = self.side.recv(source=source, tag=ANSWER)
                self.received += 1
                if survey == self.surveys:
                    nodes.discard(self.node_of[source])
                    seen.update({r: s for r, s in read(rows).items() if r in ranks})
            time.sleep(LONGEST_NAP)
        return seen

    def _ask(self, ranks):
        self._queries += [self.side.isend(self.surveys, rank, QUERY) for rank in ranks]
        self._queries = [request for request in self._queries if not request.Test()]

    def elsewhere(self, ranks):
        """[(rank, description)] of `ranks` not waiting where this rank waits."""
        seen, found = self.survey(ranks), []
        for rank in ranks:
            if rank not in seen:
                found.append((rank, f"unreachable: no answer from {self.ranks[rank]['host']} in "
                                    f"{ANSWER_SECONDS:g} s"))
                continue
            age, step, activity, waiting = seen[rank]
            where = f"{'waiting in' if waiting else 'in'} {activity} at step {step}"
            if age >= SILENT_SECONDS:
                found.append((rank, f"stopped: no heartbeat for {age:.1f} s, last seen {where}"))
            elif not (waiting and step == self.step and activity == decode(*self.activity)):
                found.append((rank, f"alive {age:.1f} s ago, {where}"))
        return found

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
                last = now
                if not self.threaded and now - self._answered >= TICK_SECONDS:
                    self._answer()
                waited = now - start
                if self.warning and not warned and waited >= self.warning:
                    warned = True
                    self._warn(waited)
                    last = time.monotonic()  # a survey's wait for answers is no stop of this rank
                if self.timeout and waited >= self.deadline:
                    self._end(waited)
        finally:
            self.waiting = False

    def _named(self, found):
        told = "; ".join(f"rank {rank} (pid {self.ranks[rank]['pid']} on {self.ranks[rank]['host']}; {what})"
                         for rank, what in found[:TOLD])
        return told + (f"; and {len(found) - TOLD} more" if len(found) > TOLD else "")

    def _here(self, waited):
        return f"rank {self.rank} has waited {waited:.1f} s in {decode(*self.activity)} at step {self.step}"

    def _warn(self, waited):
        """Rank 0 names whom it waits for; its deputy speaks only of a silent or unreachable rank 0."""
        if self.rank == 0:
            found = self.elsewhere([r for r in range(self.world.size) if r != 0])
        elif self.rank == self.deputy:
            found = [(r, what) for r, what in self.elsewhere([0]) if not what.startswith("alive")]
        else:
            return
        if found:
            _say(f"\nminidl: stall warning: {self._here(waited)} for {self._named(found)}")

    def _end(self, waited):
        """Past the deadline: rank 0, else its deputy, names the stalled ranks; the others end quietly,
        but for one line per node when both rank 0 and the deputy have failed to end the job."""
        head = f"\nminidl: collective timeout (--collective-timeout {self.timeout:g}): {self._here(waited)}"
        if self.rank in (0, self.deputy):
            found = self.elsewhere([r for r in range(self.world.size) if r != self.rank])
            stalled = [entry for entry in found if not entry[1].startswith("alive")]
            whom = f"stalled: {self._named(stalled or found)}" if found else "every rank waits there too"
            _say(f"{head}; {whom}; aborting the job")
        elif self.rank == self.node_of[self.rank]:  # the first rank of its node
            _say(f"{head}; neither rank 0 nor its deputy rank {self.deputy} ended the job; ending it")
        self.world.abort(1)


def _say(line):
    """A line on stderr, which may lead nowhere (a launcher that is gone): the job ends all the same."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass
