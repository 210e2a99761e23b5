"""The dtype policy's GPU-only features where there is no GPU: --amp and --cuda-graph are refused
with one line naming the flag and the fix (never a silent float32 or eager run), from the
library, the configuration, train.py and the step benchmark alike."""
import subprocess
import sys
from pathlib import Path

import pytest

from minidl import amp, backend, models
from minidl.config import Config
from minidl.errors import UserError
from minidl.optim import SGD

pytestmark = pytest.mark.skipif(backend.on_gpu, reason="checks the refusal where there is no GPU")
ROOT = Path(__file__).resolve().parents[2]


def test_bf16_is_refused_on_the_cpu():
    model = models.resnet20()
    with pytest.raises(UserError, match="--amp needs a GPU"):
        amp.enable(model, SGD(model.parameters(), lr=0.1))
    assert model.compute_dtype is None


@pytest.mark.parametrize("flag", ["amp", "cuda_graph"])
def test_the_configuration_refuses_gpu_flags(flag):
    with pytest.raises(UserError, match=f"--{flag.replace('_', '-')} needs a GPU"):
        Config(**{flag: True}).resolved()


@pytest.mark.parametrize("command", [
    [sys.executable, "train.py", "--amp"],
    [sys.executable, "train.py", "--cuda-graph", "--epochs", "1"],
    [sys.executable, "-m", "minidl.bench", "step", "--amp", "--model", "resnet20"],
    [sys.executable, "-m", "minidl.bench", "step", "--cuda-graph", "--model", "resnet20"],
])
@pytest.mark.slow
def test_the_command_lines_refuse_gpu_flags_in_one_line(command):
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a GPU" in lines[0], result.stderr
