"""The GPU checks of gpu_cases.py under pytest (marker `gpu`; skipped where CuPy sees no GPU):
the bf16 and CUDA-graph path (casts, SGD through device scalars, fused ops and blocks, a ResNet-50
step under --amp against float32, graph replays against eager steps, train.py's loop with
--cuda-graph), every kernel on every distinct ResNet-50 layer shape at batch 32 in fp32, TF32
and bf16, and a whole ResNet-50 training step against the CPU. tests/gpu_check.sh runs the same
cases without pytest and writes a JSON report."""
import pytest

import gpu_cases
from minidl import backend

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not backend.on_gpu, reason="needs a CUDA GPU with CuPy (none usable here)")]

CASES = gpu_cases.cases()


@pytest.mark.parametrize("check, args, kwargs", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_gpu(check, args, kwargs):
    check(*gpu_cases.device(), *args, **kwargs)
