"""--trace-steps A:B: a timeline of optimizer steps A to B (counted from 1, as steps.jsonl's
`iteration`) on every rank, written by rank 0 as one Chrome trace (minidl.training.chrome_trace).

The trainer tells a `RunTrace` when each step starts and finishes; the first traced step's
start measures every rank's clock offset from rank 0's (minidl.distributed.clock) and starts a
recorder (minidl.training.recorder), which exists only inside the window. After step B (or at
the end of a run that stopped inside the window) rank 0 gathers every rank's intervals,
aligns them and writes the file. An evaluation between two traced steps is one interval.
"""
import json
import socket
import time
from pathlib import Path

from minidl import distributed
from minidl.backend import on_gpu
from minidl.errors import UserError
from minidl.fileio import write_bytes_atomic
from minidl.training import chrome_trace
from minidl.training.recorder import TraceRecorder


def parse_steps(text):
    """'3:5' -> (3, 5), for --trace-steps."""
    first, _, last = str(text).partition(":")
    if not (first.strip().isdigit() and last.strip().isdigit() and 1 <= int(first) <= int(last)):
        raise UserError(f"--trace-steps {text!r} is not A:B with 1 <= A <= B (optimizer steps, counted from 1): "
                        "write e.g. 3:5")
    return int(first), int(last)


class RunTrace:
    def __init__(self, steps, path, comm, model, reducer, timer, outputs):
        self.first, self.last = parse_steps(steps)
        self.path, self.comm, self.outputs = Path(path), comm, outputs
        self.model, self.reducer, self.timer = model, reducer, timer
        self.recorder, self.offsets, self.written = None, None, False
        self.step, self.traced = None, []

    def step_starting(self, number):
        """Step `number` is about to begin (every rank calls it for every step)."""
        self.step = number
        if self.recorder is None and not self.written and self.first <= number <= self.last:
            self.offsets = distributed.clock_offsets(self.comm, time.perf_counter)
            self.recorder = TraceRecorder(self.model, self.timer, self.reducer)
            self.recorder.start()

    def step_finished(self):
        if self.recorder is not None:
            self.recorder.end_step(self.step)
            self.traced.append(self.step)
            if self.step == self.last:
                self.write()

    def around_evaluation(self, evaluate):
        """evaluate(), recorded as one interval inside the window."""
        if self.recorder is None:
            return evaluate()
        return self.recorder.around("evaluation", chrome_trace.EVALUATION, evaluate)

    def finish(self):
        """At the end of the run: write a window the run stopped inside, or say that no step of
        it ran (collective)."""
        if self.recorder is not None:
            self.write()
        elif not self.written:
            self.outputs.notice(f"--trace-steps {self.first}:{self.last} traced nothing: the run's steps ended at "
                                f"{self.step or 0} (or it resumed after them)")

    def write(self):
        """Gather every rank's intervals on rank 0 and write the trace (collective)."""
        recorder, self.recorder = self.recorder, None
        recorder.stop()
        tracks = recorder.track_names
        mine = {"rank": self.comm.rank, "host": socket.gethostname(), "tracks": tracks,
                "intervals": recorder.collect()}
        recordings = self.comm.gather_object(mine)
        self.written = True
        if self.comm.rank != 0:
            return
        about = {"steps": [self.traced[0], self.traced[-1]], "world_size": self.comm.size,
                 "allreduce": self.reducer.allreduce.name, "buckets": len(tracks) - 1,
                 "clock": "CUDA events on the compute stream (NCCL's for its collectives)" if on_gpu else
                          "host (time.perf_counter); a stage ends when the host first sees it complete"}
        trace = chrome_trace.document(recordings, self.offsets, about)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(self.path, json.dumps(trace).encode())
        self.outputs.notice(f"trace of steps {self.traced[0]}-{self.traced[-1]} on {self.comm.size} rank"
                            f"{'s' * (self.comm.size > 1)} in {self.path}: open it in https://ui.perfetto.dev or "
                            "chrome://tracing")
