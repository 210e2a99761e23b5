"""The GPU case list (gpu_cases.py) is sound on any machine: unique names, every ResNet-50 conv
and BN shape in each mode, and each case's arguments bind to its check's signature, so a run
on a lent GPU cannot die on a TypeError."""
import inspect
import re
from pathlib import Path

import gpu_cases
from minidl.bench.kernels import resnet50_batch_norms, resnet50_convs


def test_cases_bind_and_cover_every_shape():
    cases = gpu_cases.cases()
    names = [name for name, _, _, _ in cases]
    assert len(names) == len(set(names))
    for name, check, args, kwargs in cases:
        inspect.signature(check).bind("kernels", "cupy", *args, **kwargs)
    convs, bns = resnet50_convs(32), resnet50_batch_norms(32)
    assert sum(n.startswith("conv ") for n in names) == 3 * len(convs) - 1  # no bf16 stem
    assert sum(n.startswith("batchnorm ") and n.endswith(("plain", "relu")) for n in names) == 6 * len(bns) + 2
    assert names[-1].startswith("resnet50 training step")


def test_the_prepared_check_fits_its_budget_and_runs_its_parts():
    """tests/gpu_check.sh: its parts' limits add up to at most 8 minutes; it tunes every ResNet-50
    convolution at batch 256 and 32, runs the step benchmark's target with and without --fuse
    and two ranks on the GPU."""
    script = (Path(__file__).resolve().parents[1] / "gpu_check.sh").read_text()
    parts = dict(re.findall(r"^part (\w+) (\d+) ", script, re.MULTILINE))
    steps = re.findall(r"^    part \$name (\d+) ", script, re.MULTILINE)  # the step bench with and without --fuse
    assert set(parts) == {"env", "nvcc", "autotune", "gpu_tests", "bench_kernels", "two_ranks", "report"}
    assert len(steps) == 1 and "for fuse in no-fuse fuse" in script
    assert sum(int(limit) for limit in parts.values()) + 2 * int(steps[0]) <= 8 * 60
    assert "minidl.bench autotune --batch-sizes 256,32" in script and "tests/gpu_two_ranks.sh" in script
    assert re.search(r"minidl.bench step --device gpu --amp --cuda-graph --vs-torch --model resnet50 \\\n\s+"
                     r"--batch-size 256 --image-size 224 .*--\$fuse", script)
