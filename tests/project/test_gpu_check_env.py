"""The GPU check's env part (tests/gpu_check_parts.py) names the device whether CuPy gives its
name as bytes or as str (it changed between versions), with a fake CuPy."""
import json
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_check_parts  # noqa: E402


@pytest.mark.parametrize("name", [b"NVIDIA H200", "NVIDIA H200"])
def test_the_device_name_is_bytes_or_str(monkeypatch, tmp_path, name):
    runtime = types.SimpleNamespace(
        getDeviceProperties=lambda index: {"name": name, "multiProcessorCount": 132, "totalGlobalMem": 2**37},
        runtimeGetVersion=lambda: 13000, driverGetVersion=lambda: 13000)
    cuda = types.SimpleNamespace(runtime=runtime, Device=lambda index: types.SimpleNamespace(compute_capability="90"))
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(__version__="14.2", cuda=cuda))
    gpu_check_parts.env(tmp_path / "env.json", "false")
    assert json.loads((tmp_path / "env.json").read_text())["device"] == "NVIDIA H200"
