"""The loader benchmark runs end to end on a tiny generated tree (its figures are not asserted:
timing belongs in benchmarks, not tests)."""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # every test runs `python -m minidl.bench loader` in a child process


def bench(*args):
    return subprocess.run([sys.executable, "-m", "minidl.bench", "loader", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_loader_benchmark_reports_folder_and_shards(tmp_path):
    result = bench("--generate", 30, "--images", 8, "-b", 4, "--size", 32, "--workers", 1, "--repeat", 1,
                   "--cache-dir", tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert [(r["source"], r["workers"]) for r in report["rows"]] == [
        ("JPEG folder", 1), ("HDF5 shards", 1)]
    for row in report["rows"]:
        assert row["images_per_sec"] > 0 and row["cpu_ms_per_image"] > 0
        assert row["cores_for_gpu"] == pytest.approx(5 * row["cpu_ms_per_image"])
    assert (tmp_path / "bench-loader-30-shards" / "index.json").is_file()


def test_loader_benchmark_bad_flags_are_one_line_errors(tmp_path):
    for args in (("--workers", "one"), ("--data-path", tmp_path / "nothing")):
        result = bench(*args)
        assert result.returncode == 2
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
