"""The runtime autotuner: on a GPU, the first call of a (pass, dtype, shape) times every candidate
kernel plan and keeps the fastest; the old kernels are always among the candidates, so a kernel
written without a GPU can never make a user slower.

`Autotuner(timer, cache_path).choose(key, plans, run)` returns the plan for `key`: from memory,
else from the JSON cache of this device and CUDA version (the same cache gives the same
choices, hence the same bits), else by timing `run(plan)` for each of `plans()` (called only
for a key not in memory; the key names everything the plans depend on; `timer(function)`:
seconds, the median of a few timed calls after a warm-up; CUDA events on the GPU) and writing
the winner to the cache. Tuning cannot run while a CUDA graph is being captured (`capturing()`):
the graphed step's eager warm-up calls come first and meet every shape (minidl.training.graph);
a key first met during a capture takes the first plan, the v1 kernel, untimed.
`report()` says how many keys were tuned in this process and how long it took, and every
choice in use. MINIDL_AUTOTUNE=0 turns the tuner off: then the first plan, the v1 kernel, runs
(minidl.kernels.conv).
"""
import dataclasses
import json
import time
from pathlib import Path

from minidl.fileio import write_json_atomic

TIMED_CALLS = 3


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one convolution pass runs: kernel version, tile, and the split of its reduction."""
    version: str  # "v1" or "v2"
    tile: str     # a tile name of minidl.kernels.conv or conv_v2
    splits: int = 1

    def label(self):
        return f"{self.version}:{self.tile}:{self.splits}"

    @staticmethod
    def parse(label):
        version, tile, splits = label.split(":")
        return Plan(version, tile, int(splits))


def cuda_timer(cupy):
    """A timer of device work: the median of TIMED_CALLS calls between CUDA events, after one warm-up."""
    def timer(function):
        function()
        seconds = []
        for _ in range(TIMED_CALLS):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            function()
            end.record()
            end.synchronize()
            seconds.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
        return sorted(seconds)[len(seconds) // 2]
    return timer


class Autotuner:
    def __init__(self, timer, cache_path=None, capturing=lambda: False):
        self.timer, self.cache_path, self.capturing = timer, Path(cache_path) if cache_path else None, capturing
        self.choices = {}  # key -> Plan
        self.timings = {}  # key -> {label: seconds}, for the keys tuned in this process
        self.tuned, self.seconds = 0, 0.0
        self._cached = self._read_cache()

    def _read_cache(self):
        if self.cache_path is None or not self.cache_path.exists():
            return {}
        try:
            return json.loads(self.cache_path.read_text())
        except (OSError, ValueError):  # a damaged cache is tuned again, not fatal
            return {}

    def choose(self, key, plans, run):
        """The plan for `key` among `plans()` (timing `run(plan)` for each where `key` is new)."""
        plan = self.choices.get(key)
        if plan is not None:
            return plan
        plans = plans()
        cached = self._cached.get(key)
        if cached is not None and any(p.label() == cached for p in plans):
            plan = Plan.parse(cached)
        elif len(plans) == 1 or self.capturing():
            plan = plans[0]
        else:
            start = time.perf_counter()
            seconds = {p.label(): self.timer(lambda p=p: run(p)) for p in plans}
            plan = min(plans, key=lambda p: seconds[p.label()])
            self.timings[key] = seconds
            self.tuned += 1
            self.seconds += time.perf_counter() - start
            self._cached[key] = plan.label()
            self._write_cache()
        self.choices[key] = plan
        return plan

    def _write_cache(self):
        if self.cache_path is None:
            return
        try:
            self.cache_path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.cache_path, self._cached)
        except OSError:  # a read-only cache directory: the choices stay in memory
            self.cache_path = None

    def report(self):
        """{tuned, seconds, cache, choices: {key: label}, timings: {key: {label: seconds}}}."""
        return {"tuned": self.tuned, "seconds": self.seconds, "cache": str(self.cache_path or ""),
                "choices": {key: plan.label() for key, plan in self.choices.items()}, "timings": self.timings}


def cache_path(cache_dir, device_name, cuda_version):
    """<cache_dir>/autotune/<device>-cuda<version>.json: choices hold for one device and toolkit."""
    safe = "".join(ch if ch.isalnum() else "-" for ch in device_name).strip("-")
    return Path(cache_dir) / "autotune" / f"{safe}-cuda{cuda_version}.json"
