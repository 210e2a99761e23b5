"""`python -m minidl.bench kernels` on a CPU-only machine, and the parts of it that do not need
a GPU: the ResNet-50 shape lists (checked against the parameter count torchvision publishes)
and the report (ratios, target summaries, table)."""
import subprocess
import sys

import pytest

from minidl.bench import kernels as bench


@pytest.mark.slow
def test_says_it_needs_a_gpu_and_exits_2():
    result = subprocess.run([sys.executable, "-m", "minidl.bench", "kernels"], capture_output=True, text=True,
                            env={"MINIDL_DEVICE": "cpu", "PATH": ""}, timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "needs a CUDA GPU" in result.stderr


def test_resnet50_layers_account_for_every_parameter():
    convs = bench.resnet50_layers(32)
    assert len(convs) == 53
    weights = sum(k * r * r * c for _, (_, _, _, c, k, r, _, _) in convs)
    bn = sum(2 * shape[-1] * int(name.split("(x")[1][:-1]) if "(x" in name else 2 * shape[-1]
             for name, shape in bench.resnet50_batch_norms(32).items())
    assert weights + bn + 2048 * 1000 + 1000 == bench.PARAMETERS_RESNET50 == 25_557_032
    distinct = bench.resnet50_convs(32)
    assert len(distinct) == len(set(distinct.values())) == 23
    assert sum(int(n.split("(x")[1][:-1]) if "(x" in n else 1 for n in distinct) == 53


def test_report_ratios_targets_and_table():
    conv = {"op": "conv fwd", "mode": "tf32", "flop": 4e12, "ms": 10.0, "tflops": 400.0}
    rows = [dict(conv, layer="a", torch_ms=5.0, plan="v2:tf32_128x256:1"),
            dict(conv, layer="b", torch_ms=20.0, plan="v3:bf16_128x128:1"),
            {"op": "bn fwd", "layer": "c", "mode": "fp32", "bytes": 3e9, "ms": 1.0, "gbps": 3000.0},
            {"op": "conv", "layer": "stem", "mode": "bf16", "skipped": "bf16 needs multiples of 8"},
            {"op": "sgd", "layer": "d", "mode": "fp32", "error": "RuntimeError: boom"}]
    ceilings = {"copy_gbps": 4000.0, "tf32": 800.0, "bf16": None, "fp32": 60.0}
    summary = bench.summarize(rows, ceilings)
    assert rows[0]["vs_torch"] == 0.5 and rows[1]["vs_torch"] == 2.0 and rows[0]["of_peak"] == 0.5
    assert abs(summary["conv geomean vs cuDNN (target >= 0.5)"] - 1.0) < 1e-12
    assert summary["conv on v2 plans (1) geomean vs cuDNN"] == 0.5  # each version's rows apart
    assert summary["conv on v3 plans (1) geomean vs cuDNN"] == 2.0
    assert summary["bn median share of copy bandwidth (target >= 0.7)"] == 0.75
    table = bench.format_table(rows, ceilings, summary)
    assert "400.0 TFLOP/s" in table and "3000 GB/s" in table and "boom" in table and "multiples of 8" in table


@pytest.mark.slow
def test_measuring_code_with_emulated_kernels_and_cpu_torch(emulated, monkeypatch):
    """The benchmark's own code, where a GPU would run it: PyTorch on the CPU stands in for cuDNN,
    NumPy for CuPy, the emulator for the GPU, a counting stub for the CUDA-event timer. Each
    operation must validate against PyTorch (an oracle independent of minidl's ops) and time."""
    import numpy
    import torch
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench, "PARAMETERS_RESNET50", 4000)
    monkeypatch.setattr(bench, "resnet50_convs", lambda batch: {"3x3/2": (batch, 9, 9, 8, 16, 3, 2, 1),
                                                                "conv1 7x7/2": (batch, 11, 11, 3, 8, 7, 2, 3)})
    monkeypatch.setattr(bench, "resnet50_batch_norms", lambda batch: {"bn": (batch, 5, 7, 40)})
    calls = []

    def timer(function, torch_events=None):
        calls.append(torch_events is not None)
        function()
        return 1.0
    rows = []
    bench.bench_convs(emulated, numpy, torch, timer, ["tf32", "bf16"], 2, rows)
    bench.bench_batch_norms(emulated, numpy, torch, timer, ["tf32", "bf16"], 2, rows)
    bench.bench_sgd(emulated, numpy, torch, timer, rows)
    assert not [r for r in rows if "error" in r], [r["error"] for r in rows if "error" in r]
    by_op = {(r["op"], r["layer"], r["mode"]): r for r in rows}
    assert ("conv", "conv1 7x7/2", "bf16") in by_op and "skipped" in by_op[("conv", "conv1 7x7/2", "bf16")]
    assert ("conv dgrad", "conv1 7x7/2", "tf32") not in by_op  # the image needs no gradient
    for (op, layer, mode), row in by_op.items():
        if "max_error_vs_torch" in row:
            tolerance = 3e-2 if mode == "bf16" else 2e-3  # both sides rounded (TF32 or bf16), independently
            assert row["max_error_vs_torch"] < tolerance, (op, layer, mode, row["max_error_vs_torch"])
    assert all(r["plan"] == "v1" for r in rows if r["op"].startswith("conv ")), "no tuner: v1 ran"
    measured = [r for r in rows if "ms" in r]
    assert len(measured) == 2 * 3 + 3 - 1 + 2 * 2 + 1 and all("torch_ms" in r for r in measured)
    assert calls.count(True) == calls.count(False) == len(measured)
