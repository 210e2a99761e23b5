"""The GPU checks of the kernels, as plain cases: test_gpu.py runs them under pytest (marker
`gpu`), and tests/gpu_check.sh runs them with this module's runner, which needs no pytest
(the GPU machine may not have it), keeps going after a failure and stops at a deadline:

    python tests/kernels/gpu_cases.py --json FILE [--seconds S]

First the bf16 and CUDA-graph path (issue 8; step_checks.py and oracle.py): the casts and the
bf16 gradient sum, the SGD update through device scalars, the fused ops and fused ResNet-50
blocks, a ResNet-50 step under --amp against the float32 step (its errors go into the report),
steps replayed from a CUDA graph against eager ones, and train.py's loop with --cuda-graph.
Then every kernel against the reference ops (oracle.py; float64 references computed by the
same ops on the GPU) on every distinct ResNet-50 layer shape at batch 32, in fp32 (the exact
path), TF32 and bf16, with oracle.TOLERANCE per mode, and every plan of the convolutions fused
with batch norm on the bottleneck's shapes (normconv_checks.py); last one whole ResNet-50 training step on
the GPU against the same step on the CPU, where the error grows through 53 layers:
STEP_TOLERANCE. That step's model has the residual branches' last γ scaled down
(step_checks.LAST_GAMMA_SCALE): at plain initialization ResNet-50 with batch norm is chaotic,
and the two devices' float32 rounding alone gave gradients 2.8% apart (TF32: 59%).
"""
import argparse
import functools
import inspect
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import normconv_checks  # noqa: E402
import oracle  # noqa: E402
import step_checks  # noqa: E402
from step_checks import seeded  # noqa: E402
from minidl import Tensor, backend, kernels, models, nn, ops  # noqa: E402
from minidl.bench.kernels import PARAMETERS_RESNET50, resnet50_batch_norms, resnet50_convs  # noqa: E402
from minidl.models.resnet import Bottleneck  # noqa: E402
from minidl.intmath import round_up  # noqa: E402
from minidl.optim import SGD  # noqa: E402

BATCH = 32
STEP_BATCH = int(os.environ.get("MINIDL_GPU_STEP_BATCH", "16"))  # the CPU side of the step takes the time
# Measured on an H200 (max error of the largest gradient value): fp32 2.1e-3, TF32 3.5e-2 from
# the CPU; the GPU's own fp32 step moves by 1.5e-3 under 2^-22 relative noise on the weights (a
# few ulps) and by 6.4e-2 under 2^-11 (TF32's rounding): the model's conditioning, not the
# kernels, sets these errors. A wrong kernel gives errors of order 1.
STEP_TOLERANCE = {"fp32": 5e-3, "tf32": 1e-1}
FLAT_SIZE = round_up(PARAMETERS_RESNET50, 1024)  # the padded flat buffer
AMP_BATCH = 16  # the bf16 and graph steps: both sides run on the GPU


def device():
    import cupy
    return kernels.device(), cupy


def conv_tile(mode, channels):
    return {"fp32": "SimtTile", "tf32": "Tf32Tile" if channels % 4 == 0 else "SimtTile", "bf16": "Bf16Tile"}[mode]


def on_cupy(check):
    """A step_checks check, called with the array module only, as a case check."""
    def case(gpu, cupy, *args, **kwargs):
        return check(cupy, *args, **kwargs)
    signature = inspect.signature(check)
    gpu = inspect.Parameter("gpu", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    case.__signature__ = signature.replace(parameters=[gpu, *signature.parameters.values()])
    return case


def resnet50():
    return models.resnet50(num_classes=1000)


def amp_cases():
    """The bf16 and CUDA-graph path (issue 8), ResNet-50 shapes."""
    found = [("bf16 casts 1M values", oracle.check_casts, (), {"n": 1 << 20}),
             ("bf16 add 1M values", oracle.check_bf16_add, (), {"n": 1 << 20})]
    for inside in (False, True):
        found.append((f"sgd through device scalars {FLAT_SIZE} rate_inside={inside}", oracle.check_sgd_scalars,
                      (FLAT_SIZE, inside), {}))
    for mode, shape, residual, group_size in (("fp32", (BATCH, 112, 112, 64), False, None),
                                              ("bf16", (BATCH, 56, 56, 256), True, None),
                                              ("bf16", (BATCH, 28, 28, 512), True, 8)):
        found.append((f"fused op {mode} {shape} residual={residual} groups={group_size}",
                      on_cupy(step_checks.check_fused_op), (mode, shape, residual), {"group_size": group_size}))
    for name, (in_channels, planes, stride, size) in {"layer1.0": (64, 64, 1, 56), "layer2.0": (256, 128, 2, 56),
                                                      "layer3.1": (1024, 256, 1, 14)}.items():
        build = functools.partial(Bottleneck, in_channels, planes, stride)
        found.append((f"fused bottleneck {name} vs unfused", on_cupy(step_checks.check_fused_block),
                      (seeded(build), (BATCH, size, size, in_channels), oracle.TOLERANCE["fp32"]), {}))
    found.append((f"resnet50 amp step batch {AMP_BATCH} vs fp32", on_cupy(step_checks.check_amp_step),
                  (seeded(resnet50), (AMP_BATCH, 224, 224, 3), 1000, step_checks.AMP_TOLERANCE["resnet50"]), {}))
    for amp in (False, True):
        found.append((f"resnet50 cuda graph replay vs eager batch {AMP_BATCH} amp={amp}",
                      on_cupy(step_checks.check_graph_replay), (seeded(resnet50), (AMP_BATCH, 224, 224, 3), amp),
                      {"steps": 5, "tolerance": 1e-5}))
    found.append(("train.py loop --amp --cuda-graph vs --amp", check_training_with_graphs, (), {}))
    return found


# A bottleneck's convolutions with the batch norms around them (normconv_checks.py): (n, h, w, c,
# k, r, stride, padding) and images per statistics group (the whole batch, or ghost groups of 8)
NORMCONV_SHAPES = {"layer1.0 conv2": ((BATCH, 56, 56, 64, 64, 3, 1, 1), BATCH),
                   "layer1.0 conv3": ((BATCH, 56, 56, 64, 256, 1, 1, 0), BATCH),
                   "layer2.0 conv2": ((BATCH, 56, 56, 128, 128, 3, 2, 1), 8),
                   "layer3.1 conv2": ((BATCH, 14, 14, 256, 256, 3, 1, 1), BATCH)}


def normconv_cases():
    """Every plan of the fused passes on ResNet-50's bottleneck shapes, and the block's end."""
    found = []
    for name, (shape, images) in NORMCONV_SHAPES.items():
        for mode in ("bf16", "tf32"):
            arguments = (mode, *shape, images)
            found += [(f"normconv forward {name} {mode} groups of {images}", normconv_checks.check_forward,
                       arguments, {}),
                      (f"normconv grad-input {name} {mode} groups of {images}", normconv_checks.check_grad_input,
                       arguments, {})]
        found.append((f"normconv grad-weight {name} bf16 groups of {images}", normconv_checks.check_grad_weight,
                      ("bf16", *shape, images), {}))
    for projection in (False, True):
        found.append((f"normconv add relu 56x56x256 projection={projection}", normconv_checks.check_add_relu,
                      ("bf16", BATCH, 56, 56, 256, BATCH, projection), {}))
    return found


def check_training_with_graphs(gpu, cupy):
    with tempfile.TemporaryDirectory() as workdir:
        summaries = step_checks.check_training_with_graphs(workdir)
    return {"train_loss": [s["train_loss"] for s in summaries]}


def cases():
    """[(id, check, args, kwargs)] in the order the runner takes them: the bf16 and CUDA-graph
    path first, the kernels on every shape next, the whole training step (its CPU side is the
    longest case) last. A check is called as check(kernels, cupy, *args, **kwargs); what it
    returns goes into the report."""
    found = amp_cases()
    for name, shape in resnet50_convs(BATCH).items():
        for mode in ("fp32", "tf32", "bf16"):
            if mode == "bf16" and shape[3] % 8:
                continue  # the 3-channel stem has no bf16 tile: it stays fp32
            found.append((f"conv {name} {mode}", oracle.check_conv, (mode, *shape),
                          {"tile": conv_tile(mode, shape[3]), "every_plan": mode != "fp32"}))
    found += normconv_cases()
    for name, shape in resnet50_batch_norms(BATCH).items():
        for mode in ("fp32", "bf16"):
            for fused in (None, "relu", "add_relu"):
                found.append((f"batchnorm {name} {mode} {fused or 'plain'}", oracle.check_batch_norm, (mode, shape),
                              {"fused": fused}))
    bn1, last = resnet50_batch_norms(BATCH)["bn1"], (BATCH, 7, 7, 2048)
    found += [("batchnorm eval bn1 add_relu", oracle.check_batch_norm, ("fp32", bn1, False, "add_relu"), {}),
              ("batchnorm eval layer4 add_relu", oracle.check_batch_norm, ("fp32", last, False, "add_relu"), {}),
              ("batchnorm bn1 mean 1000 x std", oracle.check_batch_norm, ("fp32", bn1), {"offset": 1000.0})]
    for levels in (None, 4):  # 4 levels: ties in most windows, as after a ReLU
        found.append((f"max pool stem levels={levels}", oracle.check_max_pool, ((BATCH, 112, 112, 64), 3, 2, 1),
                      {"levels": levels}))
    found.append(("global avg pool 7x7x2048", oracle.check_global_avg_pool, (last,), {}))
    for smoothing in (0.0, 0.1):
        found.append((f"softmax xent 32x1000 smoothing={smoothing}", oracle.check_softmax_xent,
                      (BATCH, 1000, smoothing), {}))
    for nesterov, decay, offset, inside in ((False, True, 0, False), (True, False, 0, False), (True, True, 1, False),
                                            (False, True, 0, True)):
        found.append((f"sgd {FLAT_SIZE} nesterov={nesterov} decay={decay} offset={offset} rate_inside={inside}",
                      oracle.check_sgd, (FLAT_SIZE, nesterov, decay), {"steps": 2, "offset": offset,
                                                                        "rate_inside": inside}))
    for mode in ("fp32", "tf32"):
        found.append((f"resnet50 training step batch {STEP_BATCH} {mode} vs cpu", check_resnet50_step, (mode,), {}))
    return found


# ---- a whole training step ---------------------------------------------------------------------

def to_host(model):
    """The model's parameters and buffers as NumPy arrays (the CPU reference path)."""
    for _, module in model.named_modules():
        for parameter in module._parameters.values():
            parameter.data = backend.to_numpy(parameter.data)
        for name in list(module._buffers):
            module.register_buffer(name, backend.to_numpy(getattr(module, name)))
    return model


def resnet50_step(on_gpu, seed=0):
    """(loss, flat grad, flat params after the step, BN running stats) of one SGD step, as NumPy."""
    nn.manual_seed(seed)
    model = step_checks.randomized(lambda: models.resnet50(num_classes=1000), step_checks.LAST_GAMMA_SCALE)()
    if not on_gpu:
        to_host(model)
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, norm_weight_decay=0.0)
    rng = numpy.random.default_rng(seed)
    images = rng.standard_normal((STEP_BATCH, 224, 224, 3)).astype(numpy.float32)
    labels = rng.integers(0, 1000, STEP_BATCH)
    xp = backend.xp if on_gpu else numpy
    loss = ops.softmax_cross_entropy(model(Tensor(xp.asarray(images))), xp.asarray(labels), label_smoothing=0.1)
    optimizer.zero_grad()
    loss.backward()
    grad = backend.to_numpy(optimizer.flat.grad).copy()
    optimizer.step()
    buffers = numpy.concatenate([backend.to_numpy(b).reshape(-1) for _, b in model.named_buffers()])
    return float(loss.data), grad, backend.to_numpy(optimizer.flat.data).copy(), buffers


@functools.lru_cache(maxsize=None)
def cpu_step():
    return resnet50_step(on_gpu=False)


def check_resnet50_step(gpu, cupy, mode):
    expected = cpu_step()
    previous, gpu.allow_tf32 = gpu.allow_tf32, mode == "tf32"
    try:
        loss, grad, params, buffers = resnet50_step(on_gpu=True)
    finally:
        gpu.allow_tf32 = previous
    tolerance = STEP_TOLERANCE[mode]
    oracle.assert_close(loss, expected[0], tolerance, f"{mode} loss")
    oracle.assert_close(grad, expected[1], tolerance, f"{mode} flat gradient")
    oracle.assert_close(params, expected[2], tolerance, f"{mode} parameters after the step")
    oracle.assert_close(buffers, expected[3], tolerance, f"{mode} BN running statistics")


# ---- the runner ----------------------------------------------------------------------------------

def run(seconds, passed_earlier=frozenset()):
    """Every case, each in its own try; cases left when the time is up are reported as not run,
    and those named in `passed_earlier` are not run again."""
    deadline = time.monotonic() + seconds
    results = []
    for name, check, args, kwargs in cases():
        if name in passed_earlier:
            results.append({"case": name, "status": "passed earlier"})
            continue
        if time.monotonic() > deadline:
            results.append({"case": name, "status": "not run (out of time)"})
            continue
        started = time.monotonic()
        try:
            returned = check(*device(), *args, **kwargs)
            status, detail = "passed", "" if returned is None else json.dumps(returned, default=repr)
        except AssertionError as error:
            status, detail = "failed", str(error)
        except Exception:  # noqa: BLE001 - a crash in one case must not lose the others
            status, detail = "error", traceback.format_exc(limit=6)
        results.append({"case": name, "status": status, "seconds": round(time.monotonic() - started, 3),
                        "detail": detail})
        print(f"{status:7} {results[-1]['seconds']:7.2f}s  {name}" + (f"\n{detail}" if detail else ""), flush=True)
    return results


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True, help="where the results go")
    parser.add_argument("--seconds", type=float, default=240, help="stop starting new cases after this long")
    parser.add_argument("--skip-passed", metavar="JSON",
                        help="an earlier run's --json: its passed cases are not run again (a budgeted GPU session)")
    args = parser.parse_args(argv)
    if not backend.on_gpu:
        print("gpu_cases: CuPy sees no usable GPU", file=sys.stderr)
        return 2
    passed_earlier = frozenset()
    if args.skip_passed:
        earlier = json.loads(Path(args.skip_passed).read_text())["results"]
        passed_earlier = frozenset(r["case"] for r in earlier if r["status"] in ("passed", "passed earlier"))
    results = run(args.seconds, passed_earlier)
    counts = {s: sum(r["status"] == s for r in results) for s in sorted({r["status"] for r in results})}
    Path(args.json).write_text(json.dumps({"counts": counts, "tolerances": oracle.TOLERANCE,
                                           "step_tolerances": STEP_TOLERANCE, "results": results}, indent=1))
    print(counts)
    return 0 if set(counts) <= {"passed", "passed earlier"} else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
