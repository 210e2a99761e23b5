"""tests/gpu_check.sh without a GPU (`--dry-run`: the CPU emulator stands in for it, tiny shapes),
once as it is and once each with every v2 or every v3 kernel launch killing its process as a
sticky fault would (`--break v2`, `--break v3`): every part's file written and report.json
complete in all three; the first validates every v2 and v3 plan and checks both; the v2-broken
one still finishes every part, lists each v2 plan failed with the injected error, runs the later
parts on v1 only and chooses v1 everywhere; the v3-broken one lists each v3 plan failed, skips
the v3 cases with the canary's reason, keeps v2 and chooses v1 or v2 everywhere. Also: a rerun skips
what passed, usage errors, the step benchmark's times before its memory, and two ranks' result
file when the run fails. `pytest -s` prints each dry run's wall time and its parts' seconds."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import nvcc_check
from minidl.kernels import canary
from test_gpu_cases import PARTS

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "gpu_check.sh"
INJECTED = "illegal address (injected)"  # tests/kernels/emulated_device.py's fault
AFTER_SMOKE = PARTS[PARTS.index("smoke_canary") + 1:]


def environment():
    """This environment without the variables the check sets itself, the venv's mpiexec on PATH."""
    unset = ("MINIDL_CACHE", "MINIDL_AUTOTUNE", "MINIDL_DEVICE_KERNELS", "EMULATED_DEVICE_BREAK", "CUPY_CACHE_DIR")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(PYTHON=sys.executable, PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    return env


def gpu_check(*args, timeout=1500):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env=environment(), timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"dry" | "broken" | "broken_v3": (OUTDIR, completed process, report)} of the three dry runs."""
    found = {}
    for name, flags in (("dry", ()), ("broken", ("--break", "v2")), ("broken_v3", ("--break", "v3"))):
        out = tmp_path_factory.mktemp(name)
        started = time.monotonic()
        result = gpu_check(out, "--dry-run", *flags)
        report = json.loads((out / "report.json").read_text())
        print(f"\n{name} dry run: {time.monotonic() - started:.0f} s;",
              ", ".join(f"{p['part']} {p['seconds']} s" for p in report["parts"]))
        found[name] = out, result, report
    return found


@pytest.mark.parametrize("name", ["dry", "broken", "broken_v3"])
def test_every_part_written_and_reported(runs, name):
    out, result, report = runs[name]
    assert [p["part"] for p in report["parts"]] == PARTS, result.stdout[-3000:]
    for part in report["parts"]:
        assert isinstance(part["rc"], int) and isinstance(part["seconds"], int), part
        assert not part["timed_out"], f"{part['part']} ran out of time: {report[part['part']]}"
        if part["part"] != "report":  # report.json is the report itself
            assert json.loads((out / part["result"]).read_text()) == report[part["part"]]
        assert (out / f"{part['part']}.log").exists()
    assert report["dry_run"] and report["env"]["device"] == "emulated (CPU)"
    assert report["passed"] == (result.returncode == 0) == all(p["rc"] == 0 for p in report["parts"])
    nvcc = report["nvcc"]  # copied when `--prepare` made it from these sources, else why not
    assert nvcc["key"] == nvcc_check.source_key()
    assert "kernels" in nvcc or nvcc["failed"].startswith(("missing", "stale"))
    rc = {p["part"]: p["rc"] for p in report["parts"]}
    expected_failures = {"nvcc"} | ({"smoke_canary"} if name.startswith("broken") else set())
    assert {part for part, code in rc.items() if code} <= expected_failures, rc
    assert report["bench_step"]["minidl_img_per_s"] > 0 and report["bench_step"]["torch_peak_mb"] > 0
    assert report["bench_fused"]["fuse"] and report["two_ranks"]["passed"]
    assert report["bench_kernels"]["rows"] and not any("error" in r for r in report["bench_kernels"]["rows"])


def test_the_dry_run_validates_every_plan_and_checks_v2_and_v3(runs):
    out, result, report = runs["dry"]
    assert report["smoke_wgmma"]["passed"] and report["v3_off"] is False
    found = report["smoke_canary"]
    assert found["counts"]["ok"] == len(found["plans"]) == len(canary.PLANS), found["counts"]
    assert report["v1_only"] is False and not any(p["v1_only"] for p in report["parts"])
    for version in ("v2", "v3"):
        cases = report[f"{version}_cases"]
        assert cases["counts"] == {"passed": cases["cases"]}
        assert any(f"{version}:" in r["detail"] for r in cases["results"])  # the plans each case checked
    assert not any("v3:" in r["detail"] for r in report["v2_cases"]["results"])
    tests = report["gpu_tests"]
    skipped = [r["case"] for r in tests["results"] if r["status"] == "skipped"]
    assert set(tests["counts"]) == {"passed", "skipped"} and all("graph" in case for case in skipped)
    assert report["autotune"]["rows"]


def test_the_broken_run_lists_each_v2_failure_and_chooses_v1(runs):
    out, result, report = runs["broken"]
    found = report["smoke_canary"]
    assert len(found["plans"]) == len(canary.PLANS)
    v2 = [plan for plan in found["plans"] if " v2 " in plan["plan"]]
    assert v2 and all(plan["status"] == "failed" and INJECTED in plan["error"] for plan in v2)
    assert "smoke part failed" in report["v1_only"]
    for part in report["parts"]:
        assert part["v1_only"] == (part["part"] in AFTER_SMOKE), part
    for name in AFTER_SMOKE:
        assert (out / f"{name}.log").read_text().startswith("v1 only: the smoke part failed")
    rows = report["autotune"]["rows"]
    assert rows and all(row["choice"].startswith("v1") for row in rows)
    for row in rows:
        v2 = [c for c in row["candidates"] if c["plan"].startswith("v2")]
        assert v2 and all(c["status"] == "failed" and c["ms"] is None for c in v2), row
    v2_cases = {r["case"]: r["status"] for r in report["v2_cases"]["results"]}
    assert all(status == ("skipped" if case.startswith("normconv") else "passed") for case, status in v2_cases.items())
    assert all(case.endswith("v1 only") for case in v2_cases if case.startswith("conv "))
    assert all(r["status"] == "skipped" and "v1 only" in r["detail"] for r in report["v3_cases"]["results"])


def test_the_v3_broken_run_fails_v3_alone_and_chooses_v1_or_v2(runs):
    out, result, report = runs["broken_v3"]
    found = report["smoke_canary"]
    assert len(found["plans"]) == len(canary.PLANS)
    for plan in found["plans"]:
        if " v3 " in plan["plan"]:
            assert plan["status"] == "failed" and INJECTED in plan["error"], plan
        else:
            assert plan["status"] == "ok", plan
    assert report["v1_only"] is False and not any(p["v1_only"] for p in report["parts"])
    assert "the canary failed v3 plans only" in result.stdout
    v3 = report["v3_cases"]["results"]
    assert v3 and all(r["status"] == "skipped" and INJECTED in r["detail"] for r in v3), v3
    assert report["v2_cases"]["counts"] == {"passed": report["v2_cases"]["cases"]}
    rows = report["autotune"]["rows"]
    assert rows and all(row["choice"].startswith(("v1", "v2")) for row in rows)
    assert any(c["plan"].startswith("v2") and c["status"] == "ok" for row in rows for c in row["candidates"])
    for row in rows:
        v3 = [c for c in row["candidates"] if c["plan"].startswith("v3")]
        assert all(c["status"] == "failed" and c["ms"] is None for c in v3), row


def test_a_rerun_skips_what_passed(runs, tmp_path):
    earlier, _, before = runs["dry"]
    result = gpu_check(tmp_path / "again", "--rerun", earlier, "--dry-run", timeout=600)
    report = json.loads((tmp_path / "again" / "report.json").read_text())
    passed_before = {p["part"] for p in before["parts"] if p["rc"] == 0} - {"env", "report"}  # those always run
    for part in report["parts"]:
        assert part["passed_earlier"] == (part["part"] in passed_before), part
        if part["passed_earlier"]:
            assert report[part["part"]] == before[part["part"]]
    assert report["rerun_of"] == str(earlier) and result.returncode == (0 if report["passed"] else 1)


def test_a_rerun_of_another_kind_and_bad_flags_are_usage_errors(runs, tmp_path):
    broken = runs["broken"][0]
    for args in ((tmp_path / "x", "--rerun", broken, "--dry-run"), (), (tmp_path / "x", "--break", "v4", "--dry-run"),
                 (tmp_path / "x", "--break", "v2"), (tmp_path / "x", "--rerun", tmp_path / "none")):
        result = gpu_check(*args, timeout=60)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_the_step_benchmark_prints_its_times_before_its_memory():
    """The memory subprocesses take as long again as the timing: a run cut short keeps the times."""
    result = subprocess.run([sys.executable, "-m", "minidl.bench", "step", "--model", "resnet8_w8", "--batch-size",
                             "2", "--image-size", "8", "--warmup", "0", "--iters", "1", "--vs-torch", "--json"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    first, last = (json.loads(line) for line in result.stdout.strip().splitlines())
    assert first["minidl_img_per_s"] > 0 and first["torch_img_per_s"] > 0 and "minidl_peak_mb" not in first
    assert last["minidl_peak_mb"] > 0 and last["torch_peak_mb"] > 0
    assert {k: last[k] for k in first} == first


def test_two_ranks_write_their_result_when_they_fail(tmp_path):
    script = str(ROOT / "tests" / "gpu_two_ranks.sh")
    no_mpiexec = {**environment(), "PATH": "/usr/bin:/bin"}
    if subprocess.run(["sh", "-c", "command -v mpiexec"], env=no_mpiexec).returncode == 0:
        pytest.skip("this machine has an mpiexec outside the venv")
    failed_training = {**environment(), "MINIDL_DEVICE": "gpu"}  # no GPU here: train.py refuses to start
    for env, why in ((no_mpiexec, "no mpiexec"), (failed_training, "train.py exited with status 2")):
        result_file = tmp_path / "two_ranks.json"
        run = subprocess.run(["bash", script, str(result_file), "--dry-run"], capture_output=True, text=True, env=env,
                             cwd=ROOT, timeout=120)
        found = json.loads(result_file.read_text())
        assert run.returncode == 1 and found["passed"] is False and why in found["failed"], (run.stdout, found)
        result_file.unlink()
    assert "MINIDL_DEVICE=gpu" in found["log_tail"]
