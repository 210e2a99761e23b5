"""The benchmarks run and report what they promise (their figures are not asserted: timing
belongs in benchmarks, not tests)."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # every test runs `python -m minidl.bench` in a child process


def bench(*args):
    return subprocess.run([sys.executable, "-m", "minidl.bench", *args], capture_output=True, text=True, timeout=300)


def test_step_benchmark_against_torch_reports_json():
    result = bench("step", "--model", "resnet20", "--batch-size", "4", "--image-size", "16", "--warmup", "1",
                   "--iters", "2", "--vs-torch", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for key in ("minidl_img_per_s", "torch_img_per_s", "ratio", "minidl_peak_mb", "torch_peak_mb"):
        assert report[key] > 0, key
    assert abs(report["ratio"] - report["minidl_img_per_s"] / report["torch_img_per_s"]) < 1e-9


@pytest.mark.parametrize("fuse, operations", [("--no-fuse", ("Conv2d.backward", "BatchNorm.forward")),
                                              ("--fuse", ("BNReLUConv2dStats.backward", "BNAddReLU.forward"))])
def test_step_benchmark_profile_lists_the_operations_and_the_saved_bytes(fuse, operations):
    result = bench("step", "--model", "resnet20", "--batch-size", "2", "--image-size", "8", "--warmup", "1",
                   "--iters", "1", "--profile", fuse)
    assert result.returncode == 0, result.stderr
    assert all(name in result.stdout for name in operations) and "KiB per image" in result.stdout


def test_step_benchmark_times_the_step_with_tracing_on_too():
    result = bench("step", "--model", "resnet20", "--batch-size", "2", "--image-size", "8", "--warmup", "1",
                   "--iters", "2", "--trace", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["traced_step_ms"] > 0 and report["minidl_step_ms"] > 0
    assert report["trace_overhead"] == pytest.approx(report["traced_step_ms"] / report["minidl_step_ms"] - 1)


def test_unknown_benchmark_and_bad_model_are_one_line_errors():
    for args in (("nosuch",), ("step", "--model", "resnet7")):
        result = bench(*args)
        assert result.returncode == 2
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
