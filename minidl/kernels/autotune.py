"""The runtime autotuner: on a GPU, the first call of a (pass, dtype, shape) times every candidate
kernel plan and keeps the fastest. The v1 kernels are always candidates, and a plan of a later
family (v2, v3) is one only after it was validated on this device and these sources, so a kernel
written without a GPU can neither make a user slower nor give a wrong result.

`Autotuner.choose` answers from memory, else from the JSON cache of this device, CUDA version
and source hash, else by timing every usable plan against v1; plans that fail or disagree are
recorded and never run again. MINIDL_AUTOTUNE=0 turns it off: the v1 kernel runs.

Details: docs/kernels.md, "minidl/kernels/autotune.py".
"""
import contextlib
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy

from minidl.backend import BF16, get_array_module
from minidl.fileio import write_json_atomic

# max|kernel − reference| / max|reference| against float64, per mode (tests/kernels/oracle.py says why)
REFERENCE_TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 1.5e-2}
TOLERANCE = {mode: 2 * REFERENCE_TOLERANCE[mode] for mode in ("bf16", "tf32")}  # max|plan − v1| / max|v1|
STATUSES = ("ok", "failed", "mismatch", "unavailable")  # unavailable: a family this GPU cannot run
WINDOW_SECONDS = 1e-3  # one timed window of back-to-back calls spans at least this
WINDOWS = 5
MAX_CALLS_PER_WINDOW = 1000
TOLD_FAILURES = 6  # kernel names in the validation's line (every one is in the cache and the report)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one convolution pass runs: kernel version, tile, and the split of its reduction."""
    version: str  # the kernel family: "v1", "v2", "v3" (or "v0", the naive kernel, only where a caller names it)
    tile: str     # a tile name of that family's launcher (minidl.kernels.conv, conv_v2, ...)
    splits: int = 1

    def label(self):
        return f"{self.version}:{self.tile}:{self.splits}"

    @staticmethod
    def parse(label):
        version, tile, splits = label.split(":")
        return Plan(version, tile, int(splits))

    def kernel_name(self, kind):
        """What one validation covers: the kernel of pass-and-fusion `kind` of this family and
        tile, and whether the split-K reduction follows it (any split count: the same kernels)."""
        return f"{kind} {self.version} {self.tile}{' split' if self.splits > 1 else ''}"


def windowed_timer(open_window, window_seconds=WINDOW_SECONDS, windows=WINDOWS):
    """A timer of one call: after a warm-up call, `count` back-to-back calls between one pair of
    marks, `count` doubled (or scaled up) from one until the pair spans at least `window_seconds`;
    the median of `windows` such windows, divided by `count`. `open_window()` marks a start and
    returns `close()`, the seconds since (CUDA events on the GPU: `cuda_window`).

    Why a window of many calls: a pair of events around ONE launch on an idle GPU also measures
    the host's launch latency (the start event runs at once, the kernel only when Python has
    launched it), which for 20-100 µs kernels favours plans of fewer launches (no split-K
    reduction), while a training step replayed from a CUDA graph has no launch latency at all.
    Back-to-back calls queue behind each other, so the window holds device time only (but the
    first call's latency, 1/count of it). Chosen over keeping the GPU busy before the start event
    (a spin kernel) because it needs no extra kernel, whose length would have to be calibrated
    against the host's speed, and it works unchanged on a wall clock (the CPU emulator)."""
    def window(function, count):
        close = open_window()
        for _ in range(count):
            function()
        return close()

    def timer(function):
        function()  # a warm-up: a first call may compile, or wait for the host
        count, span = 1, window(function, 1)
        while span < window_seconds and count < MAX_CALLS_PER_WINDOW:
            count = min(MAX_CALLS_PER_WINDOW, max(2 * count, math.ceil(count * window_seconds / max(span, 1e-9))))
            span = window(function, count)
        return statistics.median(window(function, count) / count for _ in range(windows))
    return timer


def cuda_window(cupy):
    """open_window() for windowed_timer: CUDA events on the current stream."""
    def open_window():
        start = cupy.cuda.Event()
        start.record()

        def close():
            end = cupy.cuda.Event()
            end.record()
            end.synchronize()
            return cupy.cuda.get_elapsed_time(start, end) / 1e3
        return close
    return open_window


def wall_window():
    """open_window() for windowed_timer on a wall clock (work that is done when it returns)."""
    start = time.perf_counter()
    return lambda: time.perf_counter() - start


def comparable(array):
    """A float32 copy of an output (bf16 bits widened), for comparing two plans."""
    if array.dtype == BF16:
        return (array.astype(numpy.uint32) << 16).view(numpy.float32)
    return array.astype(numpy.float32)


def relative_error(outputs, reference):
    """max over the arrays of max|a − b| / max|b|; infinite where an output is not finite."""
    worst = 0.0
    for ours, theirs in zip(outputs, reference):
        xp, ours = get_array_module(theirs), comparable(ours)
        if ours.shape != theirs.shape or not bool(xp.isfinite(ours).all()):
            return float("inf")
        if theirs.size:
            scale = max(float(xp.abs(theirs).max()), 1e-30)
            worst = max(worst, float(xp.abs(ours - theirs).max()) / scale)
    return worst


def compared_run(run, outputs):
    """plan -> the arrays of `run(plan)` to compare: `outputs` of its result (None: the result)."""
    return run if outputs is None else (lambda plan: outputs(run(plan)))


STICKY_ERRORS = ("illegal address", "launch failure", "misaligned address")


def out_of_memory(error):
    """Whether `error` is CuPy's OutOfMemoryError (by name: no CuPy import on the CPU)."""
    return type(error).__name__ == "OutOfMemoryError"


def sticky(error):
    """Whether `error` is a CUDA error that loses the process's context for good."""
    text = str(error).lower()
    return type(error).__name__ == "CUDARuntimeError" and any(words in text for words in STICKY_ERRORS)


def disagreement(error, tolerance):
    return f"max error {error:.3g} of the largest v1 value, tolerance {tolerance:g}"


class Alone:
    """The agreement of a single process: it validates, and decides for itself."""
    leads_node = True

    @staticmethod
    def union(names):
        return set(names)

    @staticmethod
    def decide(function):
        return function()


ALONE = Alone()


class Autotuner:
    def __init__(self, timer, cache_path=None, capturing=lambda: False, source_hash="", device="",
                 validate=None, agreement=ALONE):
        """`validate(known, record)`: runs the validation of every kernel not in `known` ({name:
        record}), calling `record(name, record)` after each (minidl.kernels.canary.validator);
        `record(name, record, persist=False)`: a result for this process only, not cached."""
        self.timer, self.capturing, self.validate = timer, capturing, validate
        self.cache_path = Path(cache_path) if cache_path else None
        self.source_hash, self.device, self.agreement = source_hash, device, agreement
        self.choices = {}     # key -> Plan
        self.candidates = {}  # key -> [{plan, status, seconds, max_error, error}], keys tuned here
        self.tuned, self.seconds = 0, 0.0
        self.validation = None  # {"ran", "seconds", "failed"} once validated in this process
        self.failed_elsewhere = set()  # kernel names another process of the job found failing
        self.unsaved = set()  # kernel names whose status holds for this process only
        self._cache = self._read_cache()

    def _read_cache(self):
        empty = {"source_hash": self.source_hash, "plans": {}, "choices": {}}
        if self.cache_path is None or not self.cache_path.exists():
            return empty
        try:
            cache = json.loads(self.cache_path.read_text())
        except (OSError, ValueError):  # a damaged cache is validated and tuned again, not fatal
            return empty
        if not isinstance(cache, dict) or cache.get("source_hash") != self.source_hash:
            return empty  # other kernel sources: their statuses and choices do not hold
        return {**empty, **cache}

    @contextlib.contextmanager
    def alone(self):
        """Inside, this process decides each new key by itself: for calls that the ranks make a
        different number of times (evaluation batches differ across ranks), where a collective
        decision would wait forever. Entered by every rank at once (it validates first, over the
        ranks, so that the node leaders alone run the canary). The keys decided inside are
        forgotten after: outside, every rank uses the same decision for a key."""
        self.validated()
        previous, self.agreement, known = self.agreement, ALONE, set(self.choices)
        try:
            yield self
        finally:
            self.agreement = previous
            for key in set(self.choices) - known:
                del self.choices[key]

    @property
    def statuses(self):
        """{kernel name: {status, error, max_error, seconds}} of this device and source hash."""
        return self._cache["plans"]

    def validated(self, on_result=None):
        """Validate every v2 kernel once per process (the agreement's node leader runs the hook),
        then combine the failures of every process; `on_result(name, record, reused)` is told
        of each kernel, from the cache or from the hook. Returns the statuses."""
        if self.validation is not None and on_result is None:
            return self.statuses
        for name, known in list(self.statuses.items()):
            if on_result is not None:
                on_result(name, known, True)
        start, ran = time.perf_counter(), []
        if self.validate is not None and self.agreement.leads_node:
            def record(name, result, persist=True):
                ran.append(name)
                self.statuses[name] = result
                if not persist:
                    self.unsaved.add(name)
                self._write_cache()
                if on_result is not None:
                    on_result(name, result, False)
            self.validate(dict(self.statuses), record)
        failed = {name for name, r in self.statuses.items() if r["status"] != "ok"}
        self.failed_elsewhere = self.agreement.union(failed) - failed
        self.validation = {"ran": len(ran), "seconds": time.perf_counter() - start,
                           "failed": sorted(failed | self.failed_elsewhere)}
        if ran:
            failures = [name for name in ran if self.statuses[name]["status"] not in ("ok", "unavailable")]
            more = f" and {len(failures) - TOLD_FAILURES} more" if len(failures) > TOLD_FAILURES else ""
            told = f"{len(failures)} failed: {', '.join(failures[:TOLD_FAILURES])}{more}" if failures else "none failed"
            print(f"minidl: validated {len(ran)} kernel plans on {self.device or 'this device'} in "
                  f"{self.validation['seconds']:.1f} s; {told} — using the others, v1 always among them",
                  flush=True)
        return self.statuses

    def usable(self, plan, kind):
        """Whether `plan` may run: v1 always, a later family's once validated ok here and nowhere failed."""
        if plan.version == "v1":
            return True
        name = plan.kernel_name(kind)
        return self.statuses.get(name, {}).get("status") == "ok" and name not in self.failed_elsewhere

    def choose(self, key, plans, run, kind="", tolerance=0.0, outputs=None):
        """The plan for `key` among `plans()` (v1 first), running `run(plan)` for each where `key`
        is new; `kind` names the pass (and fusion) for the kernel names, `tolerance` the
        agreement with v1 a plan must meet (TOLERANCE of the data type), `outputs(run(plan))`
        the arrays compared (default: run's result)."""
        plan = self.choices.get(key)
        if plan is not None:
            return plan
        self.validated()
        offered = plans()
        compared = compared_run(run, outputs)
        label = self.agreement.decide(lambda: self._decide(key, offered, run, compared, kind, tolerance).label())
        plan = next((p for p in offered if p.label() == label), offered[0])
        self.choices[key] = plan
        return plan

    def _decide(self, key, plans, run, compared, kind, tolerance):
        cached = self._cache["choices"].get(key)
        usable = [p for p in plans if self.usable(p, kind)]
        if cached is not None and any(p.label() == cached for p in usable):
            return Plan.parse(cached)
        if self.capturing():
            return plans[0]
        refused = {p: {"plan": p.label(), "seconds": None, **self._why_not(p.kernel_name(kind))}
                   for p in plans if p not in usable}
        if len(usable) == 1:  # v1 alone: nothing to compare or time
            self.candidates[key] = [{"plan": plans[0].label(), "status": "ok", "seconds": None, "max_error": None,
                                     "error": None}, *refused.values()]
            return plans[0]
        start = time.perf_counter()
        rows = [self._candidate(p, kind, None, run, compared, tolerance) for p in plans[:1]]
        reference = rows[0].pop("outputs")
        rows += [refused[p] if p in refused else self._candidate(p, kind, reference, run, compared, tolerance)
                 for p in plans[1:]]
        timed = [r for r in rows if r["status"] == "ok"]
        chosen = Plan.parse(min(timed, key=lambda r: r["seconds"])["plan"])
        self.candidates[key] = rows
        self.tuned += 1
        self.seconds += time.perf_counter() - start
        self._cache["choices"][key] = chosen.label()
        self._write_cache()
        return chosen

    def _why_not(self, name):
        """{status, max_error, error} of a kernel that may not run."""
        if name in self.failed_elsewhere:
            return {"status": "failed", "max_error": None, "error": "failed in another process of this job"}
        known = self.statuses.get(name) or {"status": "failed", "error": "not validated on this device"}
        return {"status": known["status"], "max_error": known.get("max_error"), "error": known["error"]}

    def _candidate(self, plan, kind, reference, run, compared, tolerance):
        """One candidate's row {plan, status, seconds, max_error (vs v1), error (why it failed)}:
        checked against `reference` (None: this is the v1 plan, whose `outputs` the row carries),
        then timed. An exception or a disagreement of a v2 plan is recorded; out of memory is
        raised unrecorded (not the kernel's fault), a sticky CUDA error recorded and raised."""
        row = {"plan": plan.label(), "status": "ok", "seconds": None, "max_error": None, "error": None}
        try:
            if reference is None:
                row.update(outputs=[comparable(a) for a in compared(plan)], max_error=0.0)
            else:
                row["max_error"] = relative_error(compared(plan), reference)
                if not row["max_error"] <= tolerance:
                    return self._fail(plan, kind, row, "mismatch", disagreement(row["max_error"], tolerance))
            row["seconds"] = self.timer(lambda: run(plan))
        except Exception as error:  # a compile or launch error of a v2 plan: record it, go on
            if reference is None or out_of_memory(error):
                raise  # the v1 kernels have nothing to fall back to; memory is the process's, not the kernel's
            failure = self._fail(plan, kind, row, "failed", f"{type(error).__name__}: {error}".splitlines()[0])
            if sticky(error):
                raise  # the CUDA context is lost: no later candidate of this process can run
            return failure
        return row

    def _fail(self, plan, kind, row, status, error):
        name = plan.kernel_name(kind)
        self.statuses[name] = {"status": status, "error": error, "max_error": row["max_error"], "seconds": None}
        self._write_cache()
        print(f"minidl: kernel plan {name} {status} ({error}); not used again on this device and sources",
              file=sys.stderr, flush=True)
        return {**row, "status": status, "error": error}

    def _write_cache(self):
        if self.cache_path is None:
            return
        try:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            saved = {name: r for name, r in self.statuses.items() if name not in self.unsaved}
            write_json_atomic(self.cache_path, {**self._cache, "plans": saved})
        except OSError:  # a read-only cache directory: the results stay in memory
            self.cache_path = None

    def report(self):
        """{tuned, seconds, cache, device, source_hash, validation, plans: {kernel name: status
        record}, choices: {key: label}, candidates: {key: [candidate rows]}}."""
        return {"tuned": self.tuned, "seconds": self.seconds, "cache": str(self.cache_path or ""),
                "device": self.device, "source_hash": self.source_hash, "validation": self.validation,
                "plans": dict(self.statuses), "choices": {key: plan.label() for key, plan in self.choices.items()},
                "candidates": self.candidates}


def cache_path(cache_dir, device_name, cuda_version):
    """<cache_dir>/autotune/<device>-cuda<version>.json: results hold for one device and toolkit
    (and, inside the file, one source hash)."""
    safe = "".join(ch if ch.isalnum() else "-" for ch in device_name).strip("-")
    return Path(cache_dir) / "autotune" / f"{safe}-cuda{cuda_version}.json"
