"""What one rank computed and communicated when: the recorder behind --trace-steps.

While `start()`ed, it observes the lower layers' hooks (None otherwise, so a run that does
not trace only checks them): the step timer's phases, every module's forward and backward, and
each gradient bucket's reduction stages. Times are host seconds on the CPU and CUDA events on
a GPU; `collect()` turns every mark into host seconds, intervals nesting on the compute track
as step > phase > module.

Details: docs/training.md, "minidl/training/recorder.py".
"""
import dataclasses
import functools
import time

from minidl import autograd, nn
from minidl.backend import on_gpu
from minidl.training.chrome_trace import BACKWARD, BUCKET, COMPUTE_TRACK, FORWARD, PHASE, STAGE, STEP

# the compute track is COMPUTE_TRACK; bucket k's communication is track k + 1
PHASE_NAMES = {"data": "data wait", "allreduce": "all-reduce wait", "optimizer": "optimizer update"}
OUTSIDE_MODULES = "(outside modules)"


class HostClock:
    """Marks are host seconds."""

    def mark(self, stream=None):
        return time.perf_counter()

    host_mark = mark

    def seconds(self, mark):
        return mark


class DeviceClock:
    """Marks are CUDA events recorded on a stream (default: the current one), read back as host
    seconds: an event recorded at construction, once the device is idle, is taken to have
    happened when its synchronize returned. `host_mark()` is a mark of the host's own time."""

    def __init__(self):
        import cupy
        self.cupy = cupy
        cupy.cuda.Device().synchronize()
        self.origin = self.mark()
        self.origin.synchronize()
        self.origin_seconds = time.perf_counter()

    def mark(self, stream=None):
        event = self.cupy.cuda.Event()
        event.record(stream)
        return event

    def host_mark(self):
        return time.perf_counter()

    def seconds(self, mark):
        if isinstance(mark, float):  # a host_mark
            return mark
        mark.synchronize()
        return self.origin_seconds + self.cupy.cuda.get_elapsed_time(self.origin, mark) / 1e3


@dataclasses.dataclass
class Interval:
    track: int
    name: str
    category: str  # one of minidl.training.chrome_trace's categories
    start: tuple  # marks; the interval starts at the latest of them
    end: object  # a mark
    args: dict


@dataclasses.dataclass
class BackwardRun:
    """Consecutive Functions of one module in backward."""
    scope: str
    start: object
    end: object = None
    ops: dict = dataclasses.field(default_factory=dict)  # Function names, in order, once each


class TraceRecorder:
    def __init__(self, model, timer, reducer=None):
        """Record `model`'s modules, the phases `timer` marks and, with a `reducer` whose
        reduction is active, its buckets' communication."""
        self.clock = DeviceClock() if on_gpu else HostClock()
        self.timer = timer
        self.reducer = reducer if reducer is not None and reducer.active else None
        root = type(model).__name__
        self.module_names = {id(m): name.rstrip(".") or root for name, m in model.named_modules()}
        self.intervals = []
        self.step_start = self.last_mark = None
        self.backward_run = None
        self.final = {}  # bucket -> mark when its gradients were final
        self.stage_start = {}  # bucket -> marks of its running stage's start
        plans = self.reducer.plans if self.reducer is not None else []
        self.streams = [[stage.comm.stream_for(stage.src) for stage in plan.stages] for plan in plans]
        self.bucket_args = [bucket_args(model, self.reducer, k) for k in range(len(plans))]

    @property
    def track_names(self):
        return ["compute"] + [f"bucket {k}: {args['parameters']}" for k, args in enumerate(self.bucket_args)]

    def start(self):
        nn.Module.call_hook = self._module_call
        autograd.set_backward_observer(self._backward_started, self._backward_finished)
        self.timer.observer = self
        if self.reducer is not None:
            self.reducer.on_final = self._bucket_final
            for k, plan in enumerate(self.reducer.plans):
                plan.on_stage = functools.partial(self._stage, k)

    def stop(self):
        nn.Module.call_hook = None
        autograd.set_backward_observer()
        self.timer.observer = None
        if self.reducer is not None:
            self.reducer.on_final = None
            for plan in self.reducer.plans:
                plan.on_stage = None

    def collect(self):
        """The intervals recorded so far as (track, name, category, start, end, args) in host
        seconds, in the order they ended; the recorder forgets them."""
        self._close_backward_run()
        seconds = self.clock.seconds
        collected = [(i.track, i.name, i.category, max(seconds(m) for m in i.start), seconds(i.end), i.args)
                     for i in self.intervals]
        self.intervals = []
        return collected

    def _add(self, track, name, category, start, end, args=None):
        self.intervals.append(Interval(track, name, category, start if isinstance(start, tuple) else (start,), end,
                                       args or {}))

    # --- the step and its phases (the timer's observer) --------------------------------------

    def started(self):
        self.step_start = self.last_mark = self.clock.mark()

    def marked(self, phase):
        if phase == "backward":
            self._close_backward_run()
        now = self.clock.mark()
        self._add(COMPUTE_TRACK, PHASE_NAMES.get(phase, phase), PHASE, self.last_mark, now)
        self.last_mark = now

    def end_step(self, number):
        """Close step `number`: from the timer's start to its last mark."""
        self._add(COMPUTE_TRACK, f"step {number}", STEP, self.step_start, self.last_mark, {"step": number})

    def around(self, name, category, function):
        """function(), recorded as one interval (its modules are not recorded one by one)."""
        start = self.clock.mark()
        nn.Module.call_hook = None
        try:
            result = function()
        finally:
            nn.Module.call_hook = self._module_call
        self._add(COMPUTE_TRACK, name, category, start, self.clock.mark())
        return result

    # --- forward and backward of the modules ------------------------------------------------

    def _module_call(self, module, args):
        name = self.module_names.get(id(module))
        if name is None:  # not the traced model's
            return module.forward(*args)
        outer = autograd.set_scope(name)
        start = self.clock.mark()
        try:
            output = module.forward(*args)
        finally:
            autograd.set_scope(outer)
        shape = list(getattr(output, "shape", ()))
        self._add(COMPUTE_TRACK, name, FORWARD, start, self.clock.mark(), {"output": shape})
        return output

    def _backward_started(self, function):
        run = self.backward_run
        if run is None or run.scope != function.scope:
            self._close_backward_run()
            run = self.backward_run = BackwardRun(function.scope, self.clock.mark())
        run.ops[type(function).__name__] = None

    def _backward_finished(self, function):
        self.backward_run.end = self.clock.mark()

    def _close_backward_run(self):
        run, self.backward_run = self.backward_run, None
        if run is not None:
            self._add(COMPUTE_TRACK, run.scope or OUTSIDE_MODULES, BACKWARD, run.start, run.end,
                      {"ops": ", ".join(run.ops)})

    # --- the buckets' communication -----------------------------------------------------------

    def _bucket_final(self, k):
        self.final[k] = self.clock.mark()

    def _stage(self, k, index, moment):
        """A plan's on_stage: a stage starts before it is issued and ends when issued on a device
        stream (its end is an event queued behind it), else when the host first sees it done."""
        stream = self.streams[k][index]
        if moment == "start":
            self.stage_start[k] = (self.clock.mark(),) + ((self.clock.mark(stream),) if stream is not None else ())
        elif moment == ("issued" if stream is not None else "done"):
            plan = self.reducer.plans[k]
            end = self.clock.mark(stream) if stream is not None else self.clock.host_mark()
            stage = plan.stages[index]
            self._add(k + 1, f"{stage.op} ({stage.group})", STAGE, self.stage_start.pop(k), end,
                      {"algorithm": self.reducer.allreduce.name, "op": stage.op, "group": stage.group,
                       "ranks": stage.comm.size,
                       "bytes": stage.nbytes, "bucket": k})
            if index == len(plan.stages) - 1:
                self._add(k + 1, f"bucket {k}", BUCKET, self.final.pop(k), end, self.bucket_args[k])


def bucket_args(model, reducer, k):
    """What bucket k holds: its bytes and the parameters (by name) it overlaps."""
    start, stop = reducer.bounds[k]
    flat, name_of = reducer.flat, {id(p): name for name, p in model.named_parameters()}
    names = [name_of[id(p)] for p, (begin, end) in zip(flat.params, flat.segments) if begin < stop and start < end]
    grad = flat.grad
    return {"bytes": (stop - start) * grad.itemsize, "elements": stop - start,
            "parameters": f"{names[0]} … {names[-1]}" if len(names) > 1 else (names[0] if names else "padding")}
