"""The canary on the CPU emulator (tests/kernels/emulated_device.py as the device): a child that
dies mid-plan loses that plan only, a wrong kernel is a mismatch, the command line writes every
plan and reuses what the cache holds; the tuner of an emulated device through
MINIDL_DEVICE_KERNELS. Each runs child processes: slow."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minidl.kernels import autotune, canary, loader

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WGRAD = [p.name for p in canary.PLANS
         if p.plan.version == "v2" and p.conv_pass == "conv_wgrad" and not p.fuse and p.plan.splits == 1]

pytestmark = pytest.mark.slow


@pytest.fixture
def device_env(monkeypatch, tmp_path):
    """This process and its children on the emulated device, with a fresh cache."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("MINIDL_DEVICE_KERNELS", "emulated_device:device")
    monkeypatch.setenv("MINIDL_CACHE", str(tmp_path / "cache"))
    for name in ("EMULATED_DEVICE_BREAK", "EMULATED_DEVICE_BREAK_KERNELS", "MINIDL_AUTOTUNE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def validate_only(names, **options):
    """Run the canary's driver on `names` (every other plan known already): {name: record}."""
    recorded = {}
    known = {p.name: {"status": "ok"} for p in canary.PLANS if p.name not in names}
    canary.validator(**options)(known, lambda name, record, persist=True: recorded.setdefault(name, record))
    return recorded


def test_a_child_that_dies_mid_plan_loses_that_plan_only(device_env):
    assert [name.split()[2] for name in WGRAD] == ["bf16_128x256", "bf16_256x128", "bf16_128x128"]
    device_env.setenv("EMULATED_DEVICE_BREAK", "v2")
    device_env.setenv("EMULATED_DEVICE_BREAK_KERNELS", "256, 128, 64")  # the middle one's tile
    recorded = validate_only(WGRAD)
    assert list(recorded) == WGRAD, "every plan recorded, in order, the driver finished"
    dead = recorded[WGRAD[1]]
    assert dead["status"] == "failed" and "signal 6" in dead["error"] and "illegal address (injected)" in dead["error"]
    assert recorded[WGRAD[0]]["status"] == "ok" and recorded[WGRAD[2]]["status"] == "ok", recorded


def test_a_wrong_kernel_is_a_mismatch(device_env):
    device_env.setenv("EMULATED_DEVICE_BREAK", "v2-wrong")
    (record,) = validate_only(WGRAD[2:]).values()
    assert record["status"] == "mismatch" and record["max_error"] > autotune.TOLERANCE["bf16"]


def test_a_plan_that_hangs_times_out(device_env):
    device_env.setenv("EMULATED_DEVICE_BREAK", "v2-hang")
    device_env.setenv("EMULATED_DEVICE_BREAK_KERNELS", "256, 128, 64")
    recorded = validate_only(WGRAD[1:], timeout=10)
    assert list(recorded) == WGRAD[1:] and "timed out after 10 s" in recorded[WGRAD[1]]["error"]
    assert recorded[WGRAD[2]]["status"] == "ok"


def test_a_child_that_cannot_start_fails_every_plan_once(device_env):
    device_env.setenv("MINIDL_DEVICE_KERNELS", "no_such_module:device")
    recorded = validate_only(WGRAD)
    assert list(recorded) == WGRAD and all(r["status"] == "failed" and "before its first plan" in r["error"]
                                           for r in recorded.values())


def test_a_child_that_cannot_start_is_not_cached_as_the_kernels_failure(device_env, tmp_path, capsys):
    device_env.setenv("MINIDL_DEVICE_KERNELS", "no_such_module:device")
    path = tmp_path / "autotune.json"
    tuner = autotune.Autotuner(lambda function: 0.0, path, validate=canary.validator())
    statuses = tuner.validated()
    assert len(statuses) == len(canary.PLANS) and all(r["status"] == "failed" for r in statuses.values())
    assert json.loads(path.read_text())["plans"] == {}, "the next process validates again"
    told = [line for line in capsys.readouterr().err.splitlines() if "before its first plan" in line]
    assert len(told) == 1 and "nothing recorded" in told[0]


def test_an_interrupted_driver_kills_its_child(device_env):
    children = []

    def interrupted(process, progress, record, timeout):
        children.append(process)
        assert process.poll() is None, "the child still runs when the parent is interrupted"
        raise KeyboardInterrupt

    device_env.setattr(canary, "poll", interrupted)
    with pytest.raises(KeyboardInterrupt):
        validate_only(WGRAD)
    assert children[0].returncode is not None and children[0].returncode < 0, "killed, not left running"


def test_the_child_imports_this_minidl(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert canary.child_env()["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]
    monkeypatch.delenv("PYTHONPATH")
    assert canary.child_env()["PYTHONPATH"] == str(ROOT)


def canary_cli(*flags):
    return subprocess.run([sys.executable, "-m", "minidl.kernels.canary", *flags], capture_output=True, text=True,
                          timeout=600)


def test_the_command_line_reuses_the_cache_and_writes_every_plan(device_env, tmp_path):
    """Every plan in the cache but one, and one of them a mismatch: the missing one runs, the file
    lists all, the status says one is not ok."""
    statuses = {p.name: {"status": "ok", "error": None, "max_error": 0.0, "seconds": 0.1} for p in canary.PLANS}
    del statuses[WGRAD[2]]
    statuses[WGRAD[0]] = {"status": "mismatch", "error": "max error 1", "max_error": 1.0, "seconds": 0.1}
    cache = write_cache(tmp_path, statuses)
    result = canary_cli("--json", str(tmp_path / "canary.json"), "--plan-timeout", "60")
    assert result.returncode == 1, result.stderr
    written = json.loads((tmp_path / "canary.json").read_text())
    assert written["device"] == "emulator" and written["source_hash"] == canary.source_hash()
    assert written["counts"] == {"ok": len(canary.PLANS) - 1, "failed": 0, "mismatch": 1, "unavailable": 0}
    rows = {row["plan"]: row for row in written["plans"]}
    assert rows.keys() == {p.name for p in canary.PLANS}
    assert rows[WGRAD[2]]["status"] == "ok" and rows[WGRAD[2]]["dtype"] == "bf16"
    assert rows[WGRAD[2]]["seconds"] > 0 and rows[WGRAD[2]]["max_error"] <= autotune.TOLERANCE["bf16"]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == len(canary.PLANS) + 2
    assert lines[-1].startswith(f"canary: {len(canary.PLANS)} plans on emulator, {len(canary.PLANS) - 1} ok")
    assert json.loads(cache.read_text())["plans"][WGRAD[2]]["status"] == "ok", "the tuner's cache holds it now"


@pytest.mark.parametrize("flags, env, says", [
    (["--jsn", "x"], {}, "usage: python -m minidl.kernels.canary --json FILE"),
    (["--json", "/no/such/folder/x.json"], {}, "does not exist"),
    (["--json", "x.json"], {"MINIDL_AUTOTUNE": "0"}, "MINIDL_AUTOTUNE=0"),
    (["--json", "x.json"], {"MINIDL_CANARY": "0"}, "MINIDL_CANARY=0"),
    (["--json", "x.json"], {"MINIDL_DEVICE_KERNELS": ""}, "no GPU here"),
    (["--json", "x.json", "--plan-timeout", "0"], {}, "--plan-timeout 0: give the seconds"),
    (["--json", "x.json", "--plan-timeout"], {}, "usage: python -m minidl.kernels.canary --json FILE"),
    (["--json", "x.json", "--skip", "v4", "--reason", "no"], {}, "--skip v4 --reason 'no': give one of v2, v3"),
    (["--json", "x.json", "--skip", "v3"], {}, "--skip v3 --reason None: give one of v2, v3"),
])
def test_the_command_line_refuses_in_one_line(device_env, flags, env, says):
    for name, value in env.items():
        device_env.setenv(name, value)
    result = canary_cli(*flags)
    assert result.returncode == 2 and says in result.stderr and len(result.stderr.strip().splitlines()) == 1


def write_cache(tmp_path, statuses):
    """The emulated device's tuner cache holding `statuses` for these sources; its path."""
    cache = autotune.cache_path(tmp_path / "cache", "emulator", "emu")
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({"source_hash": canary.source_hash(), "plans": statuses, "choices": {}}))
    return cache


def bench_autotune(tmp_path):
    """`python -m minidl.bench autotune --shapes small --json F`: (result, rows of F)."""
    result = subprocess.run([sys.executable, "-m", "minidl.bench", "autotune", "--shapes", "small", "--json",
                             str(tmp_path / "autotune.json")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return result, json.loads((tmp_path / "autotune.json").read_text())["rows"]


def test_the_device_validates_what_its_cache_lacks_and_checks_every_candidate(device_env, tmp_path):
    """The bf16 128×128 kernels write wrong results. The cache says all of them are ok but lacks
    one: the device's tuner validates that one first (the canary finds it wrong), and while
    tuning it compares the others with v1 at the real shapes, so none of them is chosen and each
    is recorded, for a later process."""
    statuses = {p.name: {"status": "ok", "error": None, "max_error": 0.0, "seconds": 0.1} for p in canary.PLANS}
    del statuses[WGRAD[2]]
    cache = write_cache(tmp_path, statuses)
    device_env.setenv("EMULATED_DEVICE_BREAK", "v2-wrong")
    device_env.setenv("EMULATED_DEVICE_BREAK_KERNELS", "128, 128, 64")
    result, rows = bench_autotune(tmp_path)
    assert "validated 1 kernel plans on emulator" in result.stdout and f"1 failed: {WGRAD[2]}" in result.stdout
    assert rows and all("v2:bf16_128x128" not in r["choice"] for r in rows)
    forward = [c for r in rows if r["key"].startswith("conv_fwd") for c in r["candidates"]
               if c["plan"].startswith("v2:bf16_128x128")]
    assert forward and all(c["status"] == "mismatch" and c["max_error"] > autotune.TOLERANCE["bf16"]
                           for c in forward), forward
    assert "not used again" in result.stderr
    assert json.loads(cache.read_text())["plans"]["conv_fwd v2 bf16_128x128"]["status"] == "mismatch"


def test_the_autotune_bench_on_a_broken_device_chooses_v1(device_env, tmp_path):
    """Every v2 kernel failed validation (as with EMULATED_DEVICE_BREAK=v2): each row chooses v1
    and names each v2 candidate failed, with its error; the file is complete."""
    write_cache(tmp_path, {p.name: {"status": "failed", "error": "the canary process died (killed by signal 6): "
                                                                 "illegal address (injected)", "max_error": None,
                                    "seconds": None} for p in canary.PLANS})
    device_env.setenv("EMULATED_DEVICE_BREAK", "v2")  # a v2 launch would kill the benchmark
    _, rows = bench_autotune(tmp_path)
    assert len(rows) == 6 and all(r["choice"].startswith("v1:") for r in rows)
    for r in rows:
        v2 = [c for c in r["candidates"] if c["plan"].startswith("v2")]
        assert v2 and all(c["status"] == "failed" and "illegal address" in c["error"] for c in v2)


@pytest.mark.parametrize("mode, ranks_per_node", [("nodes", "1"), ("node", "2")])
def test_two_ranks_validate_per_node_and_decide_once(tmp_path, mode, ranks_per_node):
    """2 ranks under mpiexec on the emulated kernels (tests/mpi/check_tuner_agreement.py)."""
    from mpi.launch import run_checks
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")]),
           "MINIDL_DEVICE_KERNELS": "emulated_device:device", "MINIDL_CACHE": str(tmp_path),
           "MINIDL_RANKS_PER_NODE": ranks_per_node}
    assert run_checks("check_tuner_agreement.py", 2, mode, env=env, timeout=300).startswith("2 ranks passed")


def test_a_family_the_device_cannot_run_is_recorded_unavailable_and_never_started(monkeypatch):
    """v2 declared sm_90a, the device 8.0: every plan recorded unavailable with the reason, no child run."""
    from minidl.kernels import conv_v2
    monkeypatch.setattr(conv_v2, "ARCH", loader.SM_90A, raising=False)
    monkeypatch.setattr(canary, "run_child", lambda *args: pytest.fail("a child was started"))
    recorded = {}
    canary.validator(compute_capability="80")({}, lambda name, record, persist=True: recorded.setdefault(name, record))
    assert list(recorded) == [p.name for p in canary.PLANS]
    assert all(r["status"] == "unavailable" and "needs sm_90a" in r["error"] for r in recorded.values())


def test_a_skipped_version_is_recorded_unavailable_with_the_reason_and_never_started(monkeypatch):
    """`--skip v3 --reason WHY` (the GPU check after a failed wgmma self-test): v3's plans recorded
    unavailable with WHY, no child run; v2's validated as before."""
    monkeypatch.setattr(canary, "run_child", lambda *args: pytest.fail("a child was started"))
    known = {p.name: {"status": "ok"} for p in canary.PLANS if p.plan.version == "v2"}
    recorded = {}
    canary.validator(skipped={"v3": "the wgmma self-test failed"})(
        known, lambda name, record, persist=True: recorded.setdefault(name, record))
    assert list(recorded) == [p.name for p in canary.PLANS if p.plan.version == "v3"] and recorded
    assert all(r["status"] == "unavailable" and r["error"] == "the wgmma self-test failed" for r in recorded.values())
