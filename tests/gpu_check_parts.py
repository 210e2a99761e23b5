"""The bookkeeping of tests/gpu_check.sh, one command per job (the script's shell stays small):

    python tests/gpu_check_parts.py settings OUT DRY_RUN BREAK EARLIER   # OUT/check.json; 2 if EARLIER differs
    python tests/gpu_check_parts.py env FILE DRY_RUN                     # versions and the device
    python tests/gpu_check_parts.py passed-earlier EARLIER NAME V1_ONLY  # 0 where NAME passed in EARLIER
    python tests/gpu_check_parts.py record OUT NAME RESULT RC SECONDS LIMIT EARLIER V1_ONLY
    python tests/gpu_check_parts.py failed-versions CANARY_JSON           # the versions of the plans it failed
    python tests/gpu_check_parts.py report OUT V1_ONLY V3_OFF            # OUT/report.json and a summary
    python tests/gpu_check_parts.py finish OUT                           # the report's own line; 0 if all passed

`record` appends the part's line to OUT/parts.jsonl and, where the part left no result file or
an unparsable one, writes one saying so: {"failed": rc, "timed_out", "why", "log_tail"}; its exit
status is the part's (1 for a part that exited 0 without its result). V1_ONLY is empty or the
reason the v2 and v3 kernels are not used, V3_OFF empty or the reason the v3 kernels are not. Standard library only: it runs before anything is known to work.
"""
import json
import os
import platform
import sys
import time

TIMED_OUT = (124, 137)  # timeout(1)'s status, and SIGKILL's after --kill-after
LOG_TAIL = 3000  # characters of a failed part's log kept in its result file


def load_json(path):
    """The JSON at `path`, or {"unavailable": why} for a missing or cut-off file."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        return {"unavailable": f"{type(error).__name__}: {error}"}


def parts_of(out):
    path = os.path.join(out, "parts.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def settings(out, dry_run, broken, earlier):
    """Write the run's settings; a rerun must have its earlier run's --dry-run and --break."""
    check = {"dry_run": dry_run == "true", "break": broken or None, "rerun_of": earlier or None,
             "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if earlier:
        before = load_json(os.path.join(earlier, "check.json"))
        if (before.get("dry_run"), before.get("break")) != (check["dry_run"], check["break"]):
            print(f"gpu_check: --rerun {earlier} was another kind of run ({before}): rerun with the same "
                  "--dry-run and --break", file=sys.stderr)
            return 2
    with open(os.path.join(out, "check.json"), "w") as f:
        json.dump(check, f, indent=1)
    return 0


def env(path, dry_run):
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "dry_run": dry_run == "true"}
    for module in ("numpy", "cupy", "torch", "mpi4py"):
        try:
            info[module] = __import__(module).__version__
        except Exception as error:  # noqa: BLE001 - what is missing is the answer
            info[module] = f"unavailable: {error}"
    try:
        import cupy
        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"]  # bytes or str, by CuPy version
        info.update(device=name.decode() if isinstance(name, bytes) else name,
                    compute_capability=cupy.cuda.Device(0).compute_capability,
                    multiprocessors=props["multiProcessorCount"], memory_gib=round(props["totalGlobalMem"] / 2**30, 1),
                    cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(), driver=cupy.cuda.runtime.driverGetVersion())
    except Exception as error:  # noqa: BLE001
        info["device"] = "emulated (CPU)" if info["dry_run"] else f"unavailable: {error}"
    try:
        import torch
        info["cudnn"] = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        pass
    with open(path, "w") as f:
        json.dump(info, f, indent=1)
    print(info)
    return 0


def passed_earlier(earlier, name, v1_only):
    """0 where the earlier run's part `name` passed with the same v1-only state, else 1."""
    return 0 if any(p["part"] == name and p["rc"] == 0 and p.get("v1_only", False) == bool(v1_only)
                    for p in parts_of(earlier)) else 1


def record(out, name, result, rc, seconds, limit, earlier, v1_only):
    rc = int(rc)
    timed_out = rc in TIMED_OUT
    log = os.path.join(out, name + ".log")
    tail = ""
    if os.path.exists(log):
        with open(log, errors="replace") as f:
            tail = f.read()[-LOG_TAIL:]
    found = load_json(os.path.join(out, result))
    if "unavailable" in found:
        rc = rc or 1  # exiting 0 without its result is a failure too
        with open(os.path.join(out, result), "w") as f:
            json.dump({"failed": rc, "timed_out": timed_out, "why": f"no readable result file ({found['unavailable']})",
                       "log_tail": tail}, f, indent=1)
    line = {"part": name, "rc": rc, "timed_out": timed_out, "seconds": int(seconds), "limit": int(limit),
            "result": result, "v1_only": bool(v1_only), "passed_earlier": earlier == "true"}
    with open(os.path.join(out, "parts.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")
    print("\n".join(tail.rstrip().splitlines()[-3:]))
    return min(rc, 255)


def failed_versions(canary_json):
    """Prints the plan versions (v2, v3) with a plan the canary's result file says failed or
    mismatched, sorted, or "unknown" where the file lists no plans (the canary died early)."""
    plans = load_json(canary_json).get("plans")
    if not isinstance(plans, list):
        print("unknown")
        return 0
    print(" ".join(sorted({p["plan"].split()[1] for p in plans if p["status"] not in ("ok", "unavailable")})))
    return 0


def report(out, v1_only, v3_off):
    """report.json: the settings, every part's line and, under each part's name, its result."""
    parts = parts_of(out)
    result = {**load_json(os.path.join(out, "check.json")), "v1_only": v1_only or False, "v3_off": v3_off or False,
              "parts": parts, "passed": all(p["rc"] == 0 for p in parts)}
    result.update({p["part"]: load_json(os.path.join(out, p["result"])) for p in parts})
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(summary(result))
    return 0


def summary(result):
    """The report's figures in a few lines (the end of a device run's output is what comes back)."""
    def got(name, *keys):
        return {k: result.get(name, {}).get(k) for k in keys}
    rows = result.get("autotune", {}).get("rows", [])
    chosen = {version: sum(str(r.get("choice", "")).startswith(version) for r in rows) for version in ("v2", "v3")}
    lines = [f"parts: {({p['part']: p['rc'] for p in result['parts']})} | v1 only: {result['v1_only'] or 'no'}"
             f" | v3 off: {result['v3_off'] or 'no'}",
             f"wgmma smoke passed: {got('smoke_wgmma', 'passed')['passed']}; "
             f"canary: {got('smoke_canary', 'counts', 'seconds')}",
             f"v2 cases: {got('v2_cases', 'counts')}, v3 cases: {got('v3_cases', 'counts')}, "
             f"gpu tests: {got('gpu_tests', 'counts')}",
             f"autotune: v2 chosen in {chosen['v2']}, v3 in {chosen['v3']} of {len(rows)}",
             f"kernel bench summary: {result.get('bench_kernels', {}).get('summary')}"]
    keys = ("minidl_img_per_s", "torch_img_per_s", "ratio", "minidl_peak_mb", "torch_peak_mb")
    lines += [f"step bench (target >= 1.0 PyTorch eager): {got('bench_step', *keys)}",
              f"step bench --fuse (target >= 1.2, peak <= 1.0): {got('bench_fused', *keys)}",
              f"two ranks: {got('two_ranks', 'passed', 'failed', 'train_loss', 'wall_time')}"]
    return "\n".join(lines)


def finish(out):
    """Add the report part's own line to report.json; 0 when every part passed."""
    parts = parts_of(out)
    path = os.path.join(out, "report.json")
    result = load_json(path)
    result["parts"], result["passed"] = parts, all(p["rc"] == 0 for p in parts)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print("passed" if result["passed"] else "FAILED: " + ", ".join(p["part"] for p in parts if p["rc"]))
    return 0 if result["passed"] else 1


COMMANDS = {"settings": settings, "env": env, "passed-earlier": passed_earlier, "record": record,
            "failed-versions": failed_versions, "report": report, "finish": finish}

if __name__ == "__main__":
    sys.exit(COMMANDS[sys.argv[1]](*sys.argv[2:]))
