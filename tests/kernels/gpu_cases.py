"""The GPU checks of the kernels, as plain cases: test_gpu.py runs them under pytest (marker
`gpu`), and tests/gpu_check.sh runs them with this module's runner, which needs no pytest
(the GPU machine may not have it), keeps going after a failure, stops at a deadline and
rewrites its JSON after every case (a run cut short keeps what it checked):

    python tests/kernels/gpu_cases.py --json FILE [--group v2|v3|rest|all] [--shapes resnet50|small]
                                      [--v1-only] [--seconds S] [--skip-passed EARLIER_JSON]

Three groups, in this order. `v2`: the kernels that never ran on a GPU before, checked before
anything times them — every plan (v1, each v2 tile and split) of every convolution in TF32 and
bf16 against the reference ops, and every plan of the convolutions fused with batch norm
(normconv_checks.py). `v3`: every v3 plan (kernels/conv_v3.cu, sm_90a) that the canary validated
on this device (the tuner's statuses; the others are named with theirs, and a case with none is
skipped), on the shapes the emulator checks them on (v3_shapes.py) and then on every bf16
convolution of the shapes. `rest`: the bf16 and CUDA-graph path (step_checks.py and oracle.py: the
casts and the bf16 gradient sum, the SGD update through device scalars, the fused ops and fused
blocks, a training step under --amp against the float32 step, steps replayed from a CUDA graph
against eager ones, train.py's loop with --cuda-graph); every convolution in fp32 (the exact
path), batch norm, pooling, the loss and SGD against the reference ops (oracle.py; float64
references computed by the same ops on the device) with oracle.TOLERANCE per mode; last one
whole training step on the device against the same step on the reference ops, where the error
grows through the layers: STEP_TOLERANCE. That step's model has the residual branches' last γ
scaled down (step_checks.LAST_GAMMA_SCALE): at plain initialization ResNet-50 with batch norm is
chaotic, and the two devices' float32 rounding alone gave gradients 2.8% apart (TF32: 59%).

`--shapes resnet50` (the default): every distinct ResNet-50 layer shape at batch 32. `small`:
tiny shapes of the same kinds, for the emulated device (tests/gpu_check.sh --dry-run), where
the CUDA-graph cases are skipped (no graphs without CUDA). `--v1-only` (the GPU check after a
failed smoke test): the TF32 and bf16 convolutions run the v1 kernels only and the fused plans'
and the v3 cases are skipped, so no v2 or v3 kernel is launched.
"""
import argparse
import contextlib
import dataclasses
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
import v3_shapes  # noqa: E402
from step_checks import seeded  # noqa: E402
from minidl import Tensor, backend, kernels, models, nn, ops  # noqa: E402
from minidl.bench.kernels import (PARAMETERS_RESNET50, device_kernels, resnet50_batch_norms,  # noqa: E402
                                  resnet50_convs)
from minidl.errors import UserError  # noqa: E402
from minidl.fileio import write_json_atomic  # noqa: E402
from minidl.intmath import round_up  # noqa: E402
from minidl.models.resnet import Bottleneck  # noqa: E402
from minidl.optim import SGD  # noqa: E402

# Measured on an H200 (max error of the largest gradient value): fp32 2.1e-3, TF32 3.5e-2 from
# the CPU; the GPU's own fp32 step moves by 1.5e-3 under 2^-22 relative noise on the weights (a
# few ulps) and by 6.4e-2 under 2^-11 (TF32's rounding): the model's conditioning, not the
# kernels, sets these errors. A wrong kernel gives errors of order 1.
STEP_TOLERANCE = {"fp32": 5e-3, "tf32": 1e-1}
PASSING = ("passed", "passed earlier", "skipped")  # statuses that leave a run passed


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: reference_step's cache key
class Shapes:
    """The sizes the cases run at."""
    batch: int
    convs: dict          # name: (N, H, W, C, K, R, stride, padding)
    batch_norms: dict    # name: NHWC; the first also stands for the stem's (eval, large mean)
    normconv: dict       # a bottleneck's convolutions with their batch norms: name: (conv shape, images per group)
    block_end: tuple     # (N, H, W, C) of relu(bn(y) + r)
    fused_ops: tuple     # (mode, NHWC, residual, images per group or None)
    bottlenecks: dict    # name: (in channels, planes, stride, size)
    pool: tuple          # the max pool's input, NHWC
    head: tuple          # the global average pool's input, NHWC
    classes: int
    elementwise: int     # values of the casts and the bf16 sum
    flat_size: int       # the SGD buffer, padded as FlatParameters pads it
    model: str           # the whole-step cases' model (minidl.models.MODELS)
    image: int
    step_batch: int      # the step against the reference ops (the reference side takes the time)
    amp_batch: int       # the bf16 and graph steps: both sides on the device
    amp_tolerance: str   # the step_checks.AMP_TOLERANCE entry of the bf16 step


RESNET50 = Shapes(
    batch=32, convs=resnet50_convs(32), batch_norms=resnet50_batch_norms(32),
    normconv={"layer1.0 conv2": ((32, 56, 56, 64, 64, 3, 1, 1), 32),
              "layer1.0 conv3": ((32, 56, 56, 64, 256, 1, 1, 0), 32),
              "layer2.0 conv2": ((32, 56, 56, 128, 128, 3, 2, 1), 8),
              "layer3.1 conv2": ((32, 14, 14, 256, 256, 3, 1, 1), 32)},
    block_end=(32, 56, 56, 256),
    fused_ops=(("fp32", (32, 112, 112, 64), False, None), ("bf16", (32, 56, 56, 256), True, None),
               ("bf16", (32, 28, 28, 512), True, 8)),
    bottlenecks={"layer1.0": (64, 64, 1, 56), "layer2.0": (256, 128, 2, 56), "layer3.1": (1024, 256, 1, 14)},
    pool=(32, 112, 112, 64), head=(32, 7, 7, 2048), classes=1000, elementwise=1 << 20,
    flat_size=round_up(PARAMETERS_RESNET50, 1024), model="resnet50", image=224,
    step_batch=int(os.environ.get("MINIDL_GPU_STEP_BATCH", "16")), amp_batch=16, amp_tolerance="resnet50")

# The same kinds of case at sizes the emulator runs in seconds: channel counts that take the v2
# tiles (multiples of 64), the 3-channel stem on v1, a stride-2 3×3, ghost groups of one image.
SMALL = Shapes(
    batch=2, convs={"stem 7x7/2": (2, 8, 8, 3, 16, 7, 2, 3), "1x1": (2, 4, 4, 64, 64, 1, 1, 0),
                    "3x3/2": (2, 6, 6, 32, 32, 3, 2, 1)},
    batch_norms={"bn 4x4x64": (2, 4, 4, 64)},
    normconv={"1x1": ((2, 4, 4, 64, 64, 1, 1, 0), 1)}, block_end=(2, 4, 4, 64),
    fused_ops=(("fp32", (2, 4, 4, 16), False, None), ("bf16", (2, 4, 4, 16), True, 1)),
    bottlenecks={"projection": (16, 8, 2, 6)}, pool=(2, 8, 8, 16), head=(2, 2, 2, 64), classes=10,
    elementwise=4096, flat_size=4096, model="resnet8_w8", image=8, step_batch=2,
    amp_batch=4, amp_tolerance="tiny")  # at batch 2 bf16 rounding alone moves the gradient by 8% (measured, v1)

SHAPES = {"resnet50": RESNET50, "small": SMALL}


class Skipped(Exception):
    """A case that cannot run here (reported as skipped, with the reason)."""


def device():
    """(Kernels, array module) of the device: CuPy's GPU, or the emulated one (NumPy)."""
    return device_kernels()


def conv_tile(mode, channels):
    return {"fp32": "SimtTile", "tf32": "Tf32Tile" if channels % 4 == 0 else "SimtTile", "bf16": "Bf16Tile"}[mode]


def on_cupy(check):
    """A step_checks check, called with the array module only, as a case check."""
    def case(kernels, cupy, *args, **kwargs):
        return check(cupy, *args, **kwargs)
    case.kernels_in_charge = True  # see run_case
    signature = inspect.signature(check)
    first = inspect.Parameter("kernels", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    case.__signature__ = signature.replace(parameters=[first, *signature.parameters.values()])
    return case


def needs_cuda(check):
    """The check where the device is CUDA; skipped on the emulated device."""
    @functools.wraps(check)
    def case(kernels, xp, *args, **kwargs):
        if xp is numpy:
            raise Skipped("CUDA graphs exist only on a GPU (the emulated device has none)")
        return check(kernels, xp, *args, **kwargs)
    return case


def skipped(reason):
    def case(*args, **kwargs):
        raise Skipped(reason)
    return case


def model_builder(shapes):
    return lambda: models.MODELS[shapes.model](num_classes=shapes.classes)


# ---- the v2 kernels: every plan, before anything times them --------------------------------------

def v2_cases(shapes, v1_only=False):
    """Every plan of each TF32 and bf16 convolution (the v1 plan only with `v1_only`), then every
    plan of the fused passes on the bottleneck's shapes and the block's end."""
    found = []
    suffix = " v1 only" if v1_only else ""
    for name, shape in shapes.convs.items():
        for mode in ("tf32", "bf16"):
            if mode == "bf16" and shape[3] % 8:
                continue  # the 3-channel stem has no bf16 tile: it stays fp32
            found.append((f"conv {name} {mode}{suffix}", oracle.check_conv, (mode, *shape),
                          {"tile": conv_tile(mode, shape[3]), "every_plan": not v1_only, "keep": v1_or_v2}))
    return found + normconv_cases(shapes, v1_only)


def v1_or_v2(conv_pass, plan):
    """The v2 group's plans: v3's have a group of their own, after their canary and self-test."""
    return plan.version in ("v1", "v2")


def normconv_cases(shapes, v1_only):
    found = []
    for name, (shape, images) in shapes.normconv.items():
        for mode in ("bf16", "tf32"):
            arguments = (mode, *shape, images)
            found += [(f"normconv forward {name} {mode} groups of {images}", normconv_checks.check_forward,
                       arguments, {}),
                      (f"normconv grad-input {name} {mode} groups of {images}", normconv_checks.check_grad_input,
                       arguments, {})]
        found.append((f"normconv grad-weight {name} bf16 groups of {images}", normconv_checks.check_grad_weight,
                      ("bf16", *shape, images), {}))
    n, h, w, c = shapes.block_end
    for projection in (False, True):
        found.append((f"normconv add relu {h}x{w}x{c} projection={projection}", normconv_checks.check_add_relu,
                      ("bf16", n, h, w, c, n, projection), {}))
    if v1_only:  # every fused check runs each v2 plan that fits
        found = [(name, skipped("v1 only: the fused plans' checks launch the v2 kernels"), args, kwargs)
                 for name, _, args, kwargs in found]
    return found


# ---- the v3 kernels: the plans the canary validated here -----------------------------------------

def v3_cases(shapes, v1_only=False):
    """The shapes the emulator checks v3 on, then every bf16 convolution of `shapes`, each with
    every validated v3 plan of every pass (skipped, with the reason, after a failed smoke test)."""
    emulated = dict.fromkeys(shape for found in v3_shapes.SHAPES.values() for shape in found)
    found = [(f"v3 conv {'x'.join(map(str, shape))}", check_v3, shape, {}) for shape in emulated]
    found += [(f"v3 conv {name}", check_v3, shape, {}) for name, shape in shapes.convs.items() if shape[3] % 8 == 0]
    if v1_only:
        found = [(name, skipped("v1 only: no v3 kernel is launched"), args, kwargs) for name, _, args, kwargs in found]
    return found


def check_v3(kernels, xp, *shape):
    """Every v3 plan of one bf16 convolution that the canary validated on this device, against the
    reference; the offered v3 plans it did not validate are named with their status."""
    tuner = getattr(kernels, "tuner", None)
    if tuner is None:
        raise Skipped("no tuner (MINIDL_AUTOTUNE=0): no v3 plan is validated here")
    refused = {}

    def validated(conv_pass, plan):
        if plan.version != "v3":
            return False
        name = plan.kernel_name(conv_pass)
        record = tuner.statuses.get(name) or {"status": "not validated", "error": "the canary did not run it here"}
        if record["status"] != "ok":
            refused[name] = f"{record['status']}: {record.get('error')}"
        return record["status"] == "ok"

    result = oracle.check_conv(kernels, xp, "bf16", *shape, every_plan=True, keep=validated)
    if not result["plans"]:
        raise Skipped("; ".join(f"{name} {why}" for name, why in refused.items()) or "no v3 tile takes this shape")
    return {**result, "not validated": refused}


# ---- the rest ----------------------------------------------------------------------------------------

def amp_cases(shapes):
    """The bf16 and CUDA-graph path."""
    images = (shapes.amp_batch, shapes.image, shapes.image, 3)
    found = [(f"bf16 casts {shapes.elementwise} values", oracle.check_casts, (), {"n": shapes.elementwise}),
             (f"bf16 add {shapes.elementwise} values", oracle.check_bf16_add, (), {"n": shapes.elementwise})]
    for inside in (False, True):
        found.append((f"sgd through device scalars {shapes.flat_size} rate_inside={inside}",
                      oracle.check_sgd_scalars, (shapes.flat_size, inside), {}))
    for mode, shape, residual, group_size in shapes.fused_ops:
        found.append((f"fused op {mode} {shape} residual={residual} groups={group_size}",
                      on_cupy(step_checks.check_fused_op), (mode, shape, residual), {"group_size": group_size}))
    for name, (in_channels, planes, stride, size) in shapes.bottlenecks.items():
        build = functools.partial(Bottleneck, in_channels, planes, stride)
        found.append((f"fused bottleneck {name} vs unfused", on_cupy(step_checks.check_fused_block),
                      (seeded(build), (shapes.batch, size, size, in_channels), oracle.TOLERANCE["fp32"]), {}))
    found.append((f"{shapes.model} amp step batch {shapes.amp_batch} vs fp32", on_cupy(step_checks.check_amp_step),
                  (seeded(model_builder(shapes)), images, shapes.classes,
                   step_checks.AMP_TOLERANCE[shapes.amp_tolerance]), {}))
    for amp in (False, True):
        found.append((f"{shapes.model} cuda graph replay vs eager batch {shapes.amp_batch} amp={amp}",
                      needs_cuda(on_cupy(step_checks.check_graph_replay)), (seeded(model_builder(shapes)), images, amp),
                      {"steps": 5, "tolerance": 1e-5}))
    found.append(("train.py loop --amp --cuda-graph vs --amp", needs_cuda(check_training_with_graphs), (), {}))
    return found


def check_training_with_graphs(kernels, cupy):
    with tempfile.TemporaryDirectory() as workdir:
        summaries = step_checks.check_training_with_graphs(workdir)
    return {"train_loss": [s["train_loss"] for s in summaries]}


def rest_cases(shapes):
    """The bf16 and CUDA-graph path first, the fp32 convolutions and the other kernels next, the
    whole training step (its reference side is the longest case) last."""
    found = amp_cases(shapes)
    for name, shape in shapes.convs.items():
        found.append((f"conv {name} fp32", oracle.check_conv, ("fp32", *shape), {"tile": "SimtTile"}))
    for name, shape in shapes.batch_norms.items():
        for mode in ("fp32", "bf16"):
            for fused in (None, "relu", "add_relu"):
                found.append((f"batchnorm {name} {mode} {fused or 'plain'}", oracle.check_batch_norm, (mode, shape),
                              {"fused": fused}))
    stem, head = next(iter(shapes.batch_norms.values())), shapes.head
    found += [("batchnorm eval stem add_relu", oracle.check_batch_norm, ("fp32", stem, False, "add_relu"), {}),
              ("batchnorm eval head add_relu", oracle.check_batch_norm, ("fp32", head, False, "add_relu"), {}),
              ("batchnorm stem mean 1000 x std", oracle.check_batch_norm, ("fp32", stem), {"offset": 1000.0})]
    for levels in (None, 4):  # 4 levels: ties in most windows, as after a ReLU
        found.append((f"max pool stem levels={levels}", oracle.check_max_pool, (shapes.pool, 3, 2, 1),
                      {"levels": levels}))
    found.append((f"global avg pool {'x'.join(map(str, head[1:]))}", oracle.check_global_avg_pool, (head,), {}))
    for smoothing in (0.0, 0.1):
        found.append((f"softmax xent {shapes.batch}x{shapes.classes} smoothing={smoothing}", oracle.check_softmax_xent,
                      (shapes.batch, shapes.classes, smoothing), {}))
    for nesterov, decay, offset, inside in ((False, True, 0, False), (True, False, 0, False), (True, True, 1, False),
                                            (False, True, 0, True)):
        found.append((f"sgd {shapes.flat_size} nesterov={nesterov} decay={decay} offset={offset} "
                      f"rate_inside={inside}", oracle.check_sgd, (shapes.flat_size, nesterov, decay),
                      {"steps": 2, "offset": offset, "rate_inside": inside}))
    for mode in ("fp32", "tf32"):
        found.append((f"{shapes.model} training step batch {shapes.step_batch} {mode} vs reference ops",
                      check_model_step, (shapes, mode), {}))
    return found


GROUPS = {"v2": lambda shapes, v1_only: v2_cases(shapes, v1_only),
          "v3": lambda shapes, v1_only: v3_cases(shapes, v1_only),
          "rest": lambda shapes, v1_only: rest_cases(shapes),
          "all": lambda shapes, v1_only: v2_cases(shapes, v1_only) + v3_cases(shapes, v1_only) + rest_cases(shapes)}


def cases(shapes=RESNET50, group="all", v1_only=False):
    """[(id, check, args, kwargs)] in the order the runner takes them. A check is called as
    check(kernels, array module, *args, **kwargs); what it returns goes into the report."""
    return GROUPS[group](shapes, v1_only)


# ---- a whole training step -----------------------------------------------------------------------

def to_host(model):
    """The model's parameters and buffers as NumPy arrays (the reference path)."""
    for _, module in model.named_modules():
        for parameter in module._parameters.values():
            parameter.data = backend.to_numpy(parameter.data)
        for name in list(module._buffers):
            module.register_buffer(name, backend.to_numpy(getattr(module, name)))
    return model


def model_step(shapes, on_device, xp, seed=0):
    """(loss, flat grad, flat params after the step, BN running stats) of one SGD step, as NumPy:
    on the device's kernels, or on the reference ops (the host's arrays, no kernels in charge)."""
    nn.manual_seed(seed)
    model = step_checks.randomized(model_builder(shapes), step_checks.LAST_GAMMA_SCALE)()
    if not on_device:
        to_host(model)
        xp = numpy
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, norm_weight_decay=0.0)
    rng = numpy.random.default_rng(seed)
    images = rng.standard_normal((shapes.step_batch, shapes.image, shapes.image, 3)).astype(numpy.float32)
    labels = rng.integers(0, shapes.classes, shapes.step_batch)
    loss = ops.softmax_cross_entropy(model(Tensor(xp.asarray(images))), xp.asarray(labels), label_smoothing=0.1)
    optimizer.zero_grad()
    loss.backward()
    grad = backend.to_numpy(optimizer.flat.grad).copy()
    optimizer.step()
    buffers = numpy.concatenate([backend.to_numpy(b).reshape(-1) for _, b in model.named_buffers()])
    return float(loss.data), grad, backend.to_numpy(optimizer.flat.data).copy(), buffers


@functools.lru_cache(maxsize=None)
def reference_step(shapes):
    with kernels.use(None, None):  # the reference ops, also where the emulated kernels serve NumPy
        return model_step(shapes, on_device=False, xp=numpy)


def check_model_step(kernels, xp, shapes, mode):
    """The step on the device's kernels (in charge of its arrays) against the reference ops."""
    expected = reference_step(shapes)
    previous, kernels.allow_tf32 = kernels.allow_tf32, mode == "tf32"
    try:
        loss, grad, params, buffers = model_step(shapes, on_device=True, xp=xp)
    finally:
        kernels.allow_tf32 = previous
    tolerance = STEP_TOLERANCE[mode]
    oracle.assert_close(loss, expected[0], tolerance, f"{mode} loss")
    oracle.assert_close(grad, expected[1], tolerance, f"{mode} flat gradient")
    oracle.assert_close(params, expected[2], tolerance, f"{mode} parameters after the step")
    oracle.assert_close(buffers, expected[3], tolerance, f"{mode} BN running statistics")


check_model_step.kernels_in_charge = True


# ---- the runner ----------------------------------------------------------------------------------

def run_case(check, args, kwargs):
    """(status, detail) of one case; an exception is the case's result, not the run's end.

    Most checks call the kernels themselves and compute their references with minidl.ops; on the
    emulated device, whose arrays (NumPy's) the ops would hand to the kernels too, the ops run
    their reference path meanwhile, as under tests/kernels' `emulated` fixture. The checks of
    whole blocks and steps (`kernels_in_charge`) want the ops on the kernels, as on a GPU."""
    serving, xp = device()
    reference_ops = xp is numpy and not getattr(check, "kernels_in_charge", False)
    try:
        with kernels.use(None, None) if reference_ops else contextlib.nullcontext():
            returned = check(serving, xp, *args, **kwargs)
        return "passed", "" if returned is None else json.dumps(returned, default=repr)
    except Skipped as reason:
        return "skipped", str(reason)
    except AssertionError as error:
        return "failed", str(error)
    except Exception:  # noqa: BLE001 - a crash in one case must not lose the others
        return "error", traceback.format_exc(limit=6)


def run(found, seconds, passed_earlier=frozenset(), report=lambda results: None):
    """Every case of `found`, each in its own try; cases left when the time is up are reported as
    not run, those named in `passed_earlier` are not run again; `report(results)` after each."""
    deadline = time.monotonic() + seconds
    results = []
    for name, check, args, kwargs in found:
        if name in passed_earlier:
            results.append({"case": name, "status": "passed earlier"})
            continue
        if time.monotonic() > deadline:
            results.append({"case": name, "status": "not run (out of time)"})
            continue
        started = time.monotonic()
        status, detail = run_case(check, args, kwargs)
        results.append({"case": name, "status": status, "seconds": round(time.monotonic() - started, 3),
                        "detail": detail})
        print(f"{status:7} {results[-1]['seconds']:7.2f}s  {name}" + (f"\n{detail}" if detail else ""), flush=True)
        report(results)
    return results


def counts_of(results):
    return {s: sum(r["status"] == s for r in results) for s in sorted({r["status"] for r in results})}


def passed_in(path):
    """The cases an earlier run's --json reports passed (a missing or cut-off file: none)."""
    try:
        earlier = json.loads(Path(path).read_text())["results"]
    except (OSError, ValueError, KeyError, TypeError):
        return frozenset()
    return frozenset(r["case"] for r in earlier if r["status"] in ("passed", "passed earlier"))


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True, help="where the results go (rewritten after every case)")
    parser.add_argument("--group", choices=sorted(GROUPS), default="all")
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="resnet50")
    parser.add_argument("--v1-only", action="store_true", help="launch no v2 or v3 kernel (after a failed smoke test)")
    parser.add_argument("--seconds", type=float, default=240, help="stop starting new cases after this long")
    parser.add_argument("--skip-passed", metavar="JSON",
                        help="an earlier run's --json: its passed cases are not run again (a budgeted GPU session)")
    args = parser.parse_args(argv)
    try:
        device()
    except UserError as error:
        print(f"gpu_cases: {error}", file=sys.stderr)
        return 2
    found = cases(SHAPES[args.shapes], args.group, args.v1_only)
    header = {"group": args.group, "shapes": args.shapes, "v1_only": args.v1_only, "cases": len(found),
              "tolerances": oracle.TOLERANCE, "step_tolerances": STEP_TOLERANCE}

    def report(results):
        write_json_atomic(args.json, {**header, "counts": counts_of(results), "results": results})
    report([])
    results = run(found, args.seconds, passed_in(args.skip_passed) if args.skip_passed else frozenset(), report)
    report(results)
    counts = counts_of(results)
    print(counts)
    return 0 if set(counts) <= set(PASSING) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
