"""Worker processes that decode and augment batches into a shared ring (batches.Ring).

The parent puts (batch number, slot, epoch, indices) on a task queue; any idle worker writes
the images into the slot and answers with the labels and the skipped images' names (the
pixels never travel through a pipe); the parent yields the batches in order. Shutdown never
hangs and leaves no process behind: `close()` sets a stop flag, waits a few seconds, then
terminates whoever is left; workers ignore SIGINT and exit once their parent is gone.

Details: docs/data.md, "minidl/data/workers.py".
"""

import multiprocessing
import os
import pickle
import queue
import signal
import time
import traceback

from minidl.data.batches import Producer, fill_batch
from minidl.errors import UserError

POLL_SECONDS = 0.5  # how often a waiting process looks whether its peers are still alive
JOIN_SECONDS = 5.0  # how long close() waits for workers to finish their current image


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker, shown as the cause of its re-raise."""

    def __str__(self):
        return self.args[0]


def _portable(error):
    """(the exception if it survives pickling else None, its formatted traceback)."""
    text = "".join(traceback.format_exception(error))
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return None, text
    return error, text


def _work(ring, dataset, transform, seed, tasks, results, stop, parent):
    """A worker's loop: take a task, fill its slot, report; until stopped or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A worker only exits when its answers are no longer wanted: never wait to flush them.
    results.cancel_join_thread()

    def stopped():
        return stop.is_set() or os.getppid() != parent

    while not stopped():
        try:
            task = tasks.get(timeout=POLL_SECONDS)
        except queue.Empty:
            continue
        if task is None:
            return
        number, slot, epoch, indices = task
        try:
            made = fill_batch(dataset, transform, seed, epoch, indices, ring.images[slot],
                              stopped)
        except Exception as e:  # reported to the parent, which raises it and stops everyone
            results.put((number, slot, None, None, _portable(e)))
            continue
        if made is not None:
            results.put((number, slot, *made, None))


def _fork_context():
    if "fork" not in multiprocessing.get_all_start_methods():
        raise UserError("loader workers need processes started by fork (Linux, macOS): "
                        "use --workers 0 on this system")
    return multiprocessing.get_context("fork")


def _death(process):
    code = process.exitcode
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return RuntimeError(f"data loader worker {process.name} (pid {process.pid}) {how} while "
                        "making a batch")


class WorkerPool(Producer):
    """`workers` processes, forked now, filling the slots of `ring` with batches."""

    def __init__(self, ring, workers, dataset, transform, seed):
        super().__init__(ring)
        context = _fork_context()
        self.tasks, self.results, self.stop = context.Queue(), context.Queue(), context.Event()
        args = (ring, dataset, transform, seed, self.tasks, self.results, self.stop, os.getpid())
        self.processes = [context.Process(target=_work, args=args, daemon=True,
                                          name=f"minidl-loader-{n}") for n in range(workers)]
        self.closed = False
        for process in self.processes:
            process.start()

    def batches(self, epoch, batches):
        waiting, submitted = {}, 0
        for number in range(len(batches)):
            while self.free and submitted < len(batches):
                self.tasks.put((submitted, self.free.popleft(), epoch, batches[submitted]))
                submitted += 1
            while number not in waiting:
                answer = self._receive()
                waiting[answer[0]] = answer
            _, slot, labels, skipped, error = waiting.pop(number)
            if error is not None:
                raise self._reraise(*error)
            yield self.filled(slot, labels, skipped)

    def _receive(self):
        while True:
            try:
                return self.results.get(timeout=POLL_SECONDS)
            except queue.Empty:
                for process in self.processes:
                    if process.exitcode is not None:
                        raise _death(process) from None

    @staticmethod
    def _reraise(error, text):
        if error is None:
            return RuntimeError(f"a data loader worker failed:\n{text}")
        error.__cause__ = RemoteTraceback(text)
        return error

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.stop.set()
        for _ in self.processes:
            self.tasks.put(None)  # wakes the idle ones at once
        deadline = time.monotonic() + JOIN_SECONDS
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
                process.join()
        for q in (self.tasks, self.results):
            q.cancel_join_thread()  # never wait at exit to flush what no one will read
            q.close()
