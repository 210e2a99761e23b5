"""The canary: every convolution kernel after v1 (v2, v3: `VALIDATED`) run once against v1, in
child processes, before the autotuner may use it on this device and these sources
(minidl.kernels.autotune): an illegal address loses a CUDA context for good, so when a child dies
its plan is recorded failed and a new child runs the rest. The plans (`PLANS`) cover each family,
pass, data type, tile and fusion, unsplit and split, at small shapes that end inside every tile;
a family the device cannot run (its ARCH) or the caller skips (`--skip v3 --reason WHY`) is
recorded unavailable with the reason, never started. `python -m minidl.kernels.canary --json
FILE` validates alone.

Details: docs/kernels.md, "minidl/kernels/canary.py".
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy

import minidl
from minidl.backend import BF16
from minidl.errors import UserError
from minidl.fileio import write_json_atomic
from minidl.kernels import loader
from minidl.kernels.autotune import STATUSES, Plan, comparable, compared_run, disagreement, relative_error
from minidl.kernels.batchnorm import NORM, NORM_FIELDS
from minidl.kernels.conv import LATER_VERSIONS
from minidl.kernels.conv_v2 import DRELU, NORMALIZE, PASSES, STATS, Fusion, kernel_kind

STOPPED = 3  # the child's exit status after a plan that raised
PLAN_TIMEOUT = 120.0  # seconds one plan may take in the child (the CPU emulator is the slow one); --plan-timeout
IMAGES = 1  # per statistics group: two groups in a batch of two
SPLITS = 2
# (n, h, w, c, k, r, stride, padding) per data type and pass: channels a multiple of the v2 tiles'
# BK along the reduction and of none of their other edges, rows that end inside a tile, a border
# of padding, two reduction tiles (so a split has work in each part)
SHAPES = {
    "bf16": {"conv_fwd": (2, 5, 5, 128, 72, 1, 2, 1), "conv_dgrad": (2, 3, 5, 72, 128, 1, 1, 1),
             "conv_wgrad": (2, 7, 5, 72, 40, 1, 1, 1)},
    "tf32": {"conv_fwd": (2, 5, 5, 64, 36, 1, 2, 1), "conv_dgrad": (2, 3, 5, 36, 64, 1, 1, 1)},
}


# the Plan versions validated here (every one after v1: v2, v3), each with its launcher module:
# TILES (each tile's dtype and `serves(pass)`), FUSIONS (per pass, the fusion bits it has kernels
# for), ARCH where it needs one
VALIDATED = LATER_VERSIONS


def mode_of(tile):
    return "bf16" if tile.dtype == BF16 else "tf32"


class CanaryPlan(NamedTuple):
    name: str  # the kernel name the tuner's statuses use (autotune.Plan.kernel_name)
    conv_pass: str
    fuse: int
    plan: Plan

    @property
    def dtype(self):
        return mode_of(VALIDATED[self.plan.version].TILES[self.plan.tile])

    def unavailable(self, compute_capability):
        """Why a device of this compute capability cannot run the plan's family, or None."""
        return loader.unavailable(loader.required_arch(VALIDATED[self.plan.version]), compute_capability)


def canary_plans():
    plans = []
    for version, family in VALIDATED.items():
        for conv_pass in PASSES:
            for tile in family.TILES.values():
                if not tile.serves(conv_pass):
                    continue
                for fuse in family.FUSIONS[conv_pass]:
                    kind = kernel_kind(conv_pass, fuse)
                    for splits in (1,) if Fusion(fuse).whole_reduction else (1, SPLITS):
                        plan = Plan(version, tile.name, splits)
                        plans.append(CanaryPlan(plan.kernel_name(kind), conv_pass, fuse, plan))
    return plans


PLANS = canary_plans()


def source_hash():
    """What the statuses hold for: every kernels/*.cu and *.cuh, and the launchers."""
    return loader.all_sources_hash()


# ---- the child: one plan against v1 --------------------------------------------------------------
class Check:
    """A tuner stand-in for one plan: on the call it is asked about, it runs the v1 plan (once per
    key: `references` is shared by a child's plans) and the plan under test, keeps their
    disagreement, and lets the v1 plan go on."""

    def __init__(self, plan, references):
        self.plan, self.references, self.error, self.tolerance = plan, references, None, None

    def choose(self, key, plans, run, kind="", tolerance=0.0, outputs=None):
        compared = compared_run(run, outputs)
        first = plans()[0]
        if key not in self.references:
            self.references[key] = [comparable(a) for a in compared(first)]
        self.error, self.tolerance = relative_error(compared(self.plan), self.references[key]), tolerance
        return first


def run_plan(kernels, xp, canary, references):
    """(status, max_error, error text) of one canary plan on `kernels` (a Kernels) over arrays of `xp`
    (the same data for every plan of a pass and data type)."""
    n, h, w, c, k, r, stride, padding = SHAPES[canary.dtype][canary.conv_pass]
    rng = numpy.random.default_rng(0)
    p, q = (h + 2 * padding - r) // stride + 1, (w + 2 * padding - r) // stride + 1

    def draw(*dims, scale=1.0):
        values = (scale * rng.standard_normal(dims)).astype(numpy.float32)
        return xp.asarray(values if canary.dtype == "tf32" else (values.view(numpy.uint32) >> 16).astype(BF16))

    x, wt, gy = draw(n, h, w, c), draw(k, r, r, c, scale=(r * r * c) ** -0.5), draw(n, p, q, k)
    groups = n // IMAGES
    norm = numpy.zeros((groups, len(NORM_FIELDS), c), numpy.float32)
    norm[:, NORM["scale"]] = rng.uniform(0.5, 1.5, (groups, c))
    norm[:, NORM["shift"]] = rng.uniform(-0.5, 0.5, (groups, c))
    norm[:, NORM["mean"]], norm[:, NORM["inv_std"]] = rng.uniform(-0.2, 0.2, (groups, c)), 1.0
    norm = xp.asarray(norm)
    check = kernels.tuner = Check(canary.plan, references)
    fuse = canary.fuse
    if canary.conv_pass == "conv_fwd":
        kernels.conv_forward_fused(x, wt, stride, padding, norm=norm if fuse & NORMALIZE else None, images=IMAGES,
                                   stats=bool(fuse & STATS))
    elif canary.conv_pass == "conv_dgrad" and fuse & DRELU:
        kernels.conv_grad_input_fused(gy, wt, x, norm, IMAGES, stride, padding)
    elif canary.conv_pass == "conv_dgrad":
        kernels.conv_grad_input(gy, wt, x.shape, stride, padding)
    elif fuse & NORMALIZE:
        kernels.conv_grad_weight_fused(x, gy, wt.shape, norm, IMAGES, stride, padding)
    else:
        kernels.conv_grad_weight(x, gy, wt.shape, stride, padding)
    if check.error is None:
        return "failed", None, f"the canary's {canary.conv_pass} call asked no tuner: no such plan at its shape"
    if not check.error <= check.tolerance:
        return "mismatch", check.error, disagreement(check.error, check.tolerance)
    return "ok", check.error, None


def child(progress, names):
    from minidl.kernels import device, device_array_module
    kernels, xp = device(), device_array_module()
    kernels.allow_tf32 = True  # the TF32 tiles are validated whatever this process's setting
    by_name, references = {p.name: p for p in PLANS}, {}
    with open(progress, "a") as out:
        for name in names:
            out.write(json.dumps({"running": name}) + "\n")
            out.flush()
            start = time.perf_counter()
            try:
                status, max_error, error = run_plan(kernels, xp, by_name[name], references)  # synchronizes
            except Exception as failure:  # a compile or launch error, perhaps sticky: record it and stop
                status, max_error, error = "failed", None, f"{type(failure).__name__}: {failure}".splitlines()[0]
            out.write(json.dumps({"name": name, "status": status, "max_error": max_error, "error": error,
                                  "seconds": time.perf_counter() - start}) + "\n")
            out.flush()
            if status == "failed":
                return STOPPED  # the driver starts a fresh process (a fresh CUDA context) for the rest
    return 0


# ---- the driver ----------------------------------------------------------------------------------
def validator(timeout=PLAN_TIMEOUT, compute_capability=None, skipped=None):
    """The tuner's `validate(known, record)`: the canary plans not in `known`, in children; those
    of a family a device of `compute_capability` cannot run recorded unavailable, not run (None:
    the emulator, every family runs), and so are those of a version in `skipped` ({version: why},
    e.g. after its instructions failed their self-test on this device)."""
    skipped = skipped or {}

    def validate(known, record):
        pending = []
        for plan in (p for p in PLANS if p.name not in known):
            why_not = plan.unavailable(compute_capability) or skipped.get(plan.plan.version)
            if why_not:
                record(plan.name, {"status": "unavailable", "max_error": None, "error": why_not, "seconds": None})
            else:
                pending.append(plan.name)
        while pending:  # each child records at least one plan
            done = run_child(pending, record, timeout)
            pending = [name for name in pending if name not in done]
    return validate


def child_env():
    """The child's environment: this process's, with the folder of this process's minidl first on
    PYTHONPATH, so that the child imports the same minidl (a checkout, not an installed copy)."""
    env = dict(os.environ)
    path = [str(Path(minidl.__file__).resolve().parents[1]), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


def run_child(names, record, timeout):
    """Run `names` in one child until it finishes, stops or dies; `record(name, result)` for each
    plan it finished or died in. Returns the names recorded; where the child died before any
    plan (it could not import, or found no device), every name is recorded failed with the
    child's error for this process only (`persist=False`: the kernels are not at fault, the next
    process tries again), and said in one line."""
    with tempfile.TemporaryDirectory(prefix="minidl-canary-") as folder:
        progress, errors = Path(folder) / "progress.jsonl", Path(folder) / "stderr.txt"
        progress.touch()
        with open(errors, "w") as stderr:
            process = subprocess.Popen([sys.executable, "-m", "minidl.kernels.canary", "--child", str(progress),
                                        *names], stdout=subprocess.DEVNULL, stderr=stderr, env=child_env())
        try:
            done, running, timed_out = poll(process, progress, record, timeout)
        finally:  # timed out, or the parent interrupted (Ctrl-C): no child left running on the GPU
            if process.poll() is None:
                process.kill()
                process.wait()
        if running is None and done:
            return done
        status = (f"timed out after {timeout:.0f} s" if timed_out else
                  f"killed by signal {-process.returncode}" if process.returncode < 0 else
                  f"exit status {process.returncode}")
        last = next((line for line in reversed(errors.read_text().splitlines()) if line.strip()), "")
        error = f"the canary process died ({status}): {last}".rstrip(": ")
        if running is not None:
            record(running, failed(error))
            return [*done, running]
        print(f"minidl: {error}, before its first plan: the v1 kernels run in this process, nothing recorded "
              "in the tuner's cache", file=sys.stderr, flush=True)
        for name in names:
            record(name, failed(f"{error}, before its first plan"), persist=False)
        return list(names)


def poll(process, progress, record, timeout):
    """Follow the child's PROGRESS until it exits or a plan runs past `timeout` (the caller kills
    it): (the plans it finished, the plan it was running or None, whether it timed out)."""
    done, running, since, read = [], None, time.monotonic(), 0
    while True:
        exited = process.poll() is not None
        text = progress.read_text()
        lines = text[:text.rfind("\n") + 1].splitlines()  # whole lines only
        for line in lines[read:]:
            entry = json.loads(line)
            if "running" in entry:
                running = entry["running"]
            else:
                record(entry.pop("name"), entry)
                done.append(running)
                running = None
            since = time.monotonic()
        read = len(lines)
        if exited:
            return done, running, False
        if time.monotonic() - since > timeout:  # a plan that hangs, or a process that cannot end
            return done, running, True
        time.sleep(0.05)


def failed(error):
    return {"status": "failed", "max_error": None, "error": error, "seconds": None}


# ---- the command line ----------------------------------------------------------------------------
def row(name, record):
    kind, version, tile = name.split()[:3]
    tiles = VALIDATED[version].TILES if version in VALIDATED else {}
    return {"plan": name, "pass": kind, "dtype": mode_of(tiles[tile]) if tile in tiles else None,
            "status": record["status"], "error": record.get("error"), "max_error": record.get("max_error"),
            "seconds": record.get("seconds")}


USAGE = "python -m minidl.kernels.canary --json FILE [--plan-timeout SECONDS] [--skip VERSION --reason WHY]"


def plan_timeout(text):
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        raise UserError(f"--plan-timeout {text}: give the seconds one plan may take, a positive number")
    return seconds


def skipped_versions(version, reason):
    """{version: reason} of --skip and --reason (both or neither): that version's plans recorded
    unavailable for the reason, never run."""
    if version is None and reason is None:
        return {}
    if version not in VALIDATED or not reason:
        raise UserError(f"--skip {version} --reason {reason!r}: give one of {', '.join(VALIDATED)} and why it is "
                        "not run on this device")
    return {version: reason}


def main(argv):
    if len(argv) >= 2 and argv[0] == "--child":
        return child(argv[1], argv[2:])
    options = dict(zip(argv[::2], argv[1::2]))
    if len(argv) % 2 or "--json" not in options or not options.keys() <= {"--json", "--plan-timeout", "--skip",
                                                                            "--reason"}:
        raise UserError(f"usage: {USAGE}")
    path, timeout = Path(options["--json"]), plan_timeout(options.get("--plan-timeout", str(PLAN_TIMEOUT)))
    skipped = skipped_versions(options.get("--skip"), options.get("--reason"))
    if not path.parent.is_dir():
        raise UserError(f"--json {path}: the folder {path.parent} does not exist: create it or write elsewhere")
    from minidl import backend, environment, kernels
    if not (backend.on_gpu or environment.value("MINIDL_DEVICE_KERNELS")):
        raise UserError("no GPU here (CuPy sees none) and no MINIDL_DEVICE_KERNELS: run it on a GPU machine, or "
                        "set MINIDL_DEVICE_KERNELS=emulated_device:device with tests/kernels on PYTHONPATH")
    tuner = kernels.device().tuner
    if tuner is None or tuner.validate is None:
        raise UserError("MINIDL_AUTOTUNE=0 or MINIDL_CANARY=0 turns the validation off: unset it to validate the "
                        "kernels")
    tuner.validate = validator(timeout, kernels.device().compute_capability, skipped)
    start, rows = time.perf_counter(), {}

    def write():
        counts = {status: sum(r["status"] == status for r in rows.values()) for status in STATUSES}
        write_json_atomic(path, {"device": tuner.device, "source_hash": tuner.source_hash,
                                 "seconds": time.perf_counter() - start, "plans": list(rows.values()),
                                 "counts": counts})
        return counts

    def on_result(name, record, reused):
        rows[name] = row(name, record)
        write()
        told = f" ({record['error']})" if record.get("error") else ""
        print(f"{record['status']:8} {name}{' (cached)' if reused else ''}{told}", flush=True)

    write()
    tuner.validated(on_result)
    counts = write()
    print(f"canary: {len(rows)} plans on {tuner.device}, {counts['ok']} ok, {counts['failed']} failed, "
          f"{counts['mismatch']} mismatch, {counts['unavailable']} unavailable, {time.perf_counter() - start:.1f} s; "
          f"{path}", flush=True)
    return 0 if counts["ok"] + counts["unavailable"] == len(rows) else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as error:
        sys.stderr.write(f"minidl.kernels.canary: error: {error}\n")
        sys.exit(2)
