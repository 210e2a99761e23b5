"""The GPU case list (gpu_cases.py) and the prepared check (tests/gpu_check.sh) are sound on any
machine: unique names, every ResNet-50 conv and BN shape in each mode, the v2 kernels' cases
apart and first, the v3 cases after them running only the plans the canary validated, each case's arguments bound to its check's signature (a run on a lent GPU
cannot die on a TypeError), the runner's statuses and incremental report, the parts in their
order within the 8-minute budget, the nvcc report carried from the CPU machine only when current."""
import importlib.util
import inspect
import json
import re
from pathlib import Path

import numpy
import pytest

import gpu_cases
import nvcc_check
import v3_shapes
from minidl.bench.kernels import resnet50_batch_norms, resnet50_convs
from minidl.kernels import Kernels

SCRIPT_PATH = Path(__file__).resolve().parents[1] / "gpu_check.sh"
SCRIPT = SCRIPT_PATH.read_text()
PARTS = ["env", "nvcc", "smoke_ptx", "smoke_wgmma", "smoke_canary", "v2_cases", "v3_cases", "autotune", "gpu_tests",
         "bench_kernels", "bench_step", "bench_fused", "two_ranks", "report"]


@pytest.mark.parametrize("shapes", gpu_cases.SHAPES)
@pytest.mark.parametrize("v1_only", [False, True], ids=["all plans", "v1 only"])
def test_cases_bind_and_are_unique(shapes, v1_only):
    cases = gpu_cases.cases(gpu_cases.SHAPES[shapes], v1_only=v1_only)
    names = [name for name, _, _, _ in cases]
    assert len(names) == len(set(names))
    for name, check, args, kwargs in cases:
        inspect.signature(check).bind("kernels", "cupy", *args, **kwargs)


def test_cases_cover_every_resnet50_shape_v2_first():
    v2, v3, rest = (gpu_cases.cases(group=group) for group in ("v2", "v3", "rest"))
    names = [name for name, _, _, _ in gpu_cases.cases()]
    assert names == [name for name, _, _, _ in v2 + v3 + rest]
    convs, bns = resnet50_convs(32), resnet50_batch_norms(32)
    assert sum(n.startswith("conv ") for n in names) == 3 * len(convs) - 1  # no bf16 stem
    assert sum(n.startswith("batchnorm ") and n.endswith(("plain", "relu")) for n in names) == 6 * len(bns) + 2
    # every plan of every TF32 and bf16 convolution and every fused plan before anything is timed
    assert {n.split()[0] for n, *_ in v2} == {"conv", "normconv"}
    assert all(kwargs.get("every_plan") and kwargs["keep"] is gpu_cases.v1_or_v2 for n, _, _, kwargs in v2
               if n.startswith("conv "))
    assert not any(kwargs.get("every_plan") or n.startswith("normconv") for n, _, _, kwargs in rest)
    assert names[-1].startswith("resnet50 training step")


def test_the_v3_cases_are_the_emulators_shapes_then_every_bf16_convolution():
    found = gpu_cases.cases(group="v3")
    assert all(check is gpu_cases.check_v3 for _, check, _, _ in found)
    emulated = list(dict.fromkeys(shape for shapes in v3_shapes.SHAPES.values() for shape in shapes))
    bf16 = [shape for shape in resnet50_convs(32).values() if shape[3] % 8 == 0]  # all but the stem
    assert [args for _, _, args, _ in found] == emulated + bf16 and len(bf16) == len(resnet50_convs(32)) - 1
    for name, check, args, kwargs in gpu_cases.cases(group="v3", v1_only=True):
        with pytest.raises(gpu_cases.Skipped, match="v1 only"):
            check("kernels", "cupy", *args, **kwargs)


class Statuses:
    """A tuner stand-in: the canary's verdicts only."""

    def __init__(self, statuses):
        self.statuses = statuses


def test_the_v3_cases_run_only_what_the_canary_validated(emulated):
    """Forward 1×5×7×64→72, 3×3: v3 offers both tiles for the forward pass and the 128×128 one for
    grad-weight. Only the validated plan runs; the others are named with their status; none
    validated, or no tuner, is a skip that says why."""
    ok = {"status": "ok", "error": None}
    failed = {"status": "failed", "error": "illegal address"}
    shape = (1, 5, 7, 64, 72, 3, 1, 1)
    tuned = Kernels(emulated._load, 2, tuner=Statuses({"conv_fwd v3 bf16_128x128": ok,
                                                       "conv_fwd v3 bf16_128x256": failed}))
    result = gpu_cases.check_v3(tuned, numpy, *shape)
    assert result["plans"] == ["v3:bf16_128x128:1"]
    assert result["not validated"] == {"conv_fwd v3 bf16_128x256": "failed: illegal address",
                                       "conv_wgrad v3 bf16_128x128": "not validated: the canary did not run it here"}
    with pytest.raises(gpu_cases.Skipped, match="conv_fwd v3 bf16_128x256 failed: illegal address"):
        gpu_cases.check_v3(Kernels(emulated._load, 2, tuner=Statuses({"conv_fwd v3 bf16_128x256": failed})), numpy,
                           *shape)
    with pytest.raises(gpu_cases.Skipped, match="no tuner"):
        gpu_cases.check_v3(Kernels(emulated._load, 2), numpy, *shape)


def test_v1_only_launches_no_v2_kernel():
    """After a failed smoke test: the convolutions check their v1 plan only, the fused plans'
    checks (which run every v2 plan that fits) are skipped, with the reason."""
    cases = gpu_cases.cases(group="v2", v1_only=True)
    convs = [(n, kwargs) for n, _, _, kwargs in cases if n.startswith("conv ")]
    assert convs and all(n.endswith(" v1 only") and not kwargs["every_plan"] for n, kwargs in convs)
    for name, check, args, kwargs in cases:
        if name.startswith("normconv"):
            with pytest.raises(gpu_cases.Skipped, match="v1 only"):
                check("kernels", "cupy", *args, **kwargs)


def test_runner_statuses_skips_deadline_and_a_report_after_each_case():
    def passes(kernels, xp):
        return {"fine": 1}

    def fails(kernels, xp):
        assert False, "wrong"

    def crashes(kernels, xp):
        raise RuntimeError("boom")

    found = [("a", passes, (), {}), ("b", fails, (), {}), ("c", crashes, (), {}),
             ("d", gpu_cases.skipped("not here"), (), {}), ("e", passes, (), {})]
    reports = []
    original = gpu_cases.device
    gpu_cases.device = lambda: ("kernels", "cupy")
    try:
        results = gpu_cases.run(found, 60, passed_earlier={"e"}, report=lambda r: reports.append(len(r)))
        late = gpu_cases.run(found[:2], -1)
    finally:
        gpu_cases.device = original
    assert [r["status"] for r in results] == ["passed", "failed", "error", "skipped", "passed earlier"]
    assert "wrong" in results[1]["detail"] and "boom" in results[2]["detail"] and results[3]["detail"] == "not here"
    assert reports == [1, 2, 3, 4]  # after every case run
    assert [r["status"] for r in late] == ["not run (out of time)"] * 2


def test_passed_in_reads_an_earlier_report_or_nothing(tmp_path):
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"results": [{"case": "a", "status": "passed"}, {"case": "b", "status": "failed"},
                                               {"case": "c", "status": "passed earlier"}]}))
    assert gpu_cases.passed_in(earlier) == {"a", "c"}
    (tmp_path / "cut.json").write_text('{"results": [')
    assert gpu_cases.passed_in(tmp_path / "cut.json") == gpu_cases.passed_in(tmp_path / "none.json") == frozenset()


def parts_of(script):
    """[(name, limit)] of the script's `part NAME LIMIT RESULT ...` lines, in order."""
    return [(name, int(limit)) for name, limit in re.findall(r"^part (\w+) (\d+) \S+", script, re.MULTILINE)]


def test_the_prepared_check_runs_its_parts_in_order_within_8_minutes():
    """Smoke first (the wgmma self-test before the canary), the v2 and v3 cases before autotune, the
    timings after the checks; every part at its
    limit and killed 2 s after it still ends within 8 minutes; each case runner stops starting
    cases before its part's limit."""
    parts = parts_of(SCRIPT)
    assert [name for name, _ in parts] == PARTS
    assert sum(limit for _, limit in parts) + 2 * len(parts) <= 8 * 60 and "--kill-after=2" in SCRIPT
    limits = dict(parts)
    deadlines = re.findall(r"^part (\w+) .*\n?.*--seconds \$\(\((\d+) \* SCALE\)\)", SCRIPT, re.MULTILINE)
    assert [name for name, _ in deadlines] == ["v2_cases", "v3_cases", "gpu_tests"]
    for name, seconds in deadlines:
        assert int(seconds) <= limits[name] - 10, name
    assert "--batch-sizes 256,32 --modes bf16" in SCRIPT
    assert re.search(r"--device gpu --amp --cuda-graph --vs-torch --model resnet50 --batch-size 256 "
                     r"--image-size 224", SCRIPT)
    assert "--no-fuse --json \"$OUT/bench_step.json\"" in SCRIPT and "--fuse --json \"$OUT/bench_fused.json\"" in SCRIPT
    assert "tests/gpu_two_ranks.sh" in SCRIPT and "ptx_selftest.py --json" in SCRIPT
    assert "ptx_selftest.py --suite wgmma --device $SELFTEST_DEVICE" in SCRIPT
    assert "minidl.kernels.canary --json" in SCRIPT


def test_the_nvcc_report_is_carried_only_when_current(tmp_path):
    """--prepared copies a report whose key is the sources' hash and says "stale" or "missing"
    otherwise (exit 1), compiling nothing; the key changes with any file of kernels/."""
    key = nvcc_check.source_key()
    prepared, out = tmp_path / "prepared.json", tmp_path / "nvcc.json"
    prepared.write_text(json.dumps({"key": key, "failed": [], "kernels": {"conv": {}}}))
    assert nvcc_check.copy_prepared(prepared, out) == 0
    assert json.loads(out.read_text())["kernels"] == {"conv": {}}
    prepared.write_text(json.dumps({"key": "0" * 64, "failed": [], "kernels": {}}))
    assert nvcc_check.copy_prepared(prepared, out) == 1
    assert json.loads(out.read_text())["failed"].startswith("stale") and json.loads(out.read_text())["key"] == key
    assert nvcc_check.copy_prepared(tmp_path / "none.json", out) == 1
    assert json.loads(out.read_text())["failed"].startswith("missing")
    assert "--prepare" in json.loads(out.read_text())["failed"]


def test_the_nvcc_key_covers_the_headers(tmp_path, monkeypatch):
    """An edit of a header alone (ptx.cuh) makes the prepared report stale."""
    from minidl.kernels import loader
    copied = tmp_path / "kernels"
    copied.mkdir()
    for path in loader.source_dir().iterdir():
        if path.is_file():
            (copied / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(loader, "source_dir", lambda: copied)
    before = nvcc_check.source_key()
    (copied / "ptx.cuh").write_text((copied / "ptx.cuh").read_text() + "\n// an edit\n")
    assert nvcc_check.source_key() != before


def load_parts_module():
    spec = importlib.util.spec_from_file_location("gpu_check_parts", SCRIPT_PATH.with_name("gpu_check_parts.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_part_without_a_readable_result_gets_one_saying_why(tmp_path):
    """record: a part that left no result, or a cut-off one, gets {"failed", "timed_out", "why",
    "log_tail"}; one that exited 0 without its result is recorded failed; a good result stays."""
    parts = load_parts_module()
    (tmp_path / "a.log").write_text("line\n" * 5 + "the end\n")
    (tmp_path / "b.json").write_text('{"rows": [')
    (tmp_path / "c.json").write_text('{"rows": []}')
    assert parts.record(str(tmp_path), "a", "a.json", "0", "3", "10", "false", "") == 1
    assert parts.record(str(tmp_path), "b", "b.json", "124", "10", "10", "false", "smoke failed") == 124
    assert parts.record(str(tmp_path), "c", "c.json", "0", "1", "10", "true", "") == 0
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    assert a["failed"] == 1 and not a["timed_out"] and a["log_tail"].endswith("the end\n") and "no readable" in a["why"]
    assert b["failed"] == 124 and b["timed_out"]
    assert json.loads((tmp_path / "c.json").read_text()) == {"rows": []}
    lines = [json.loads(line) for line in (tmp_path / "parts.jsonl").read_text().splitlines()]
    assert [(p["part"], p["rc"], p["timed_out"], p["v1_only"], p["passed_earlier"]) for p in lines] == [
        ("a", 1, False, False, False), ("b", 124, True, True, False), ("c", 0, False, False, True)]
    assert parts.passed_earlier(str(tmp_path), "c", "") == 0
    assert parts.passed_earlier(str(tmp_path), "c", "smoke failed") == 1  # not in the same v1-only state
    assert parts.passed_earlier(str(tmp_path), "a", "") == 1
