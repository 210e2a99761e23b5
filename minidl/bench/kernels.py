"""`python -m minidl.bench kernels`: the CUDA kernels on every ResNet-50 shape, against cuDNN.

Convolutions (forward, grad-input, grad-weight), batch norm and the fused SGD update, each
validated against PyTorch and then timed, next to the device's ceiling and, when PyTorch is
importable, cuDNN / PyTorch's CUDA kernels; the v0 → v1 → v2 ladder of convolution kernels on
two layers. GPU only: on a CPU it says so and exits 2, unless
an emulated device is in charge of NumPy arrays (MINIDL_DEVICE_KERNELS; `--shapes small`).

Details: docs/ops.md, "minidl/bench/kernels.py".
"""
import argparse
import json
import math
import statistics
import sys
import time

import numpy

from minidl.distributed.costmodel import RESNET50_GRADIENT_BYTES
from minidl.errors import UserError
from minidl.fileio import writable, write_json_atomic
from minidl.intmath import round_up

# FLOP per clock per SM (dense), by compute capability: (fp32 FMA units, TF32 and bf16 tensor cores)
PEAK_FLOP_PER_CLOCK = {(8, 0): {"fp32": 128, "tf32": 1024, "bf16": 2048},
                       (9, 0): {"fp32": 256, "tf32": 2048, "bf16": 4096}}
RESNET50_STAGES = ((64, 3), (128, 4), (256, 6), (512, 3))  # (planes, blocks), v1.5: stride in the 3×3
PARAMETERS_RESNET50 = RESNET50_GRADIENT_BYTES // 4
DEVICE = "cuda"  # PyTorch's device for the peers ("cpu" beside an emulated device)
SMALL_PARAMETERS = 4096  # the SGD buffer of --shapes small
LADDER_LAYERS = ("layer1.0.conv2", "layer3.1.conv2")  # the ladder's ResNet-50 layers: 3x3, 56² and 14²
# (kernel version, mode) of each rung: plain fp32 on v0 and v1's fp32 tile, then TF32 tensor cores
LADDER = (("v0", "fp32"), ("v1", "fp32"), ("v1", "tf32"), ("v2", "tf32"))


def device_kernels():
    """(Kernels, array module) of the device the kernels run on: CuPy's GPU, or the kernels of
    MINIDL_DEVICE_KERNELS (an emulated device on NumPy arrays: the GPU check's dry run). A
    UserError where there is neither."""
    from minidl import backend, environment, kernels
    if not (backend.on_gpu or environment.value("MINIDL_DEVICE_KERNELS")):
        raise UserError("needs a CUDA GPU and CuPy (none usable here), or an emulated device "
                        "(MINIDL_DEVICE_KERNELS): run it on a GPU machine")
    return kernels.device(), kernels.device_array_module()


def resnet50_layers(batch, image=224):
    """Every convolution of ResNet-50 in network order: [(name, (N, H, W, C, K, R, stride, padding))]."""
    layers = [("conv1 7x7/2", (batch, image, image, 3, 64, 7, 2, 3))]
    size, channels = image // 4, 64
    for stage, (planes, blocks) in enumerate(RESNET50_STAGES, start=1):
        for block in range(blocks):
            stride = 2 if stage > 1 and block == 0 else 1
            out = size // stride
            prefix = f"layer{stage}.{block}"
            layers.append((f"{prefix}.conv1 1x1", (batch, size, size, channels, planes, 1, 1, 0)))
            layers.append((f"{prefix}.conv2 3x3/{stride}", (batch, size, size, planes, planes, 3, stride, 1)))
            layers.append((f"{prefix}.conv3 1x1", (batch, out, out, planes, 4 * planes, 1, 1, 0)))
            if block == 0:
                layers.append((f"{prefix}.downsample 1x1/{stride}",
                               (batch, size, size, channels, 4 * planes, 1, stride, 0)))
            size, channels = out, 4 * planes
    return layers


def resnet50_convs(batch, image=224):
    """Every distinct convolution of ResNet-50: {name: (N, H, W, C, K, R, stride, padding)}, named
    after the first layer with the shape (and how many layers share it)."""
    return _distinct(resnet50_layers(batch, image))


def resnet50_batch_norms(batch, image=224):
    """Every distinct batch-norm input of ResNet-50 (each convolution's output): {name: NHWC shape}."""
    shapes = []
    for name, (n, h, w, c, k, r, stride, padding) in resnet50_layers(batch, image):
        side = (h + 2 * padding - r) // stride + 1
        bn_name = name.split(" ")[0].replace("conv", "bn").replace("downsample", "downsample.1")
        shapes.append((bn_name, (n, side, side, k)))
    return _distinct(shapes)


def small_convs(batch):
    """A few tiny convolutions for an emulated device (seconds each): 1×1s on the v2 tiles, one of
    stride 2, edges inside every tile; at batch 2 those `bench autotune --shapes small` tunes, so
    the tuner's cache serves them."""
    return {"small 1x1": (batch, 5, 5, 64, 64, 1, 1, 0), "small 1x1/2": (batch, 6, 6, 128, 64, 1, 2, 0)}


def small_batch_norms(batch):
    return {"bn 4x4x64": (batch, 4, 4, 64)}


def _distinct(layers):
    first, count = {}, {}
    for name, shape in layers:
        first.setdefault(shape, name)
        count[shape] = count.get(shape, 0) + 1
    return {(f"{first[s]} (x{count[s]})" if count[s] > 1 else first[s]): s for s in first}


# ---- measurement -------------------------------------------------------------------------------

class HostTimer:
    """Median wall time (ms) of a callable (an emulated device computes on the host, synchronously)."""

    def __init__(self, runs, warmup):
        self.runs, self.warmup = runs, warmup

    def __call__(self, function, torch=None):  # `torch` as in Timer: PyTorch on the CPU is synchronous too
        for _ in range(self.warmup):
            function()
        times = []
        for _ in range(self.runs):
            start = time.perf_counter()
            function()
            times.append(1e3 * (time.perf_counter() - start))
        return statistics.median(times)


class Timer:
    """Median GPU time (ms) of a callable, L2 flushed before every run."""

    def __init__(self, cupy, runs, warmup):
        self.cupy, self.runs, self.warmup = cupy, runs, warmup
        l2 = cupy.cuda.Device().attributes.get("L2CacheSize", 64 << 20)
        self.flush_buffer = cupy.empty(max(2 * l2, 64 << 20) // 4, dtype=numpy.float32)

    def __call__(self, function, torch=None):
        """`torch`: time with PyTorch's events (its work runs on its own current stream)."""
        for _ in range(self.warmup):
            function()
        times = []
        for _ in range(self.runs):
            self.flush_buffer.fill(0)
            if torch is not None:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            else:
                start, end = self.cupy.cuda.Event(), self.cupy.cuda.Event()
            start.record()
            function()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) if torch is not None else self.cupy.cuda.get_elapsed_time(start, end))
        return statistics.median(times)


def copy_bandwidth(cupy, timer, values=256 << 20):
    """Measured device-to-device copy bandwidth (GB/s): 2 bytes moved per byte copied."""
    source = cupy.ones(values, dtype=numpy.float32)
    target = cupy.empty_like(source)
    milliseconds = timer(lambda: cupy.copyto(target, source))
    return 2 * source.nbytes / milliseconds / 1e6


def peak_tflops(cupy, precision):
    """Peak dense TFLOP/s at the maximum clock, or None for a device not in the table."""
    device = cupy.cuda.Device()
    capability = device.compute_capability  # e.g. "90"
    per_clock = PEAK_FLOP_PER_CLOCK.get((int(capability[:-1]), int(capability[-1])))
    clock_khz = device.attributes.get("ClockRate")
    if not per_clock or not clock_khz:
        return None
    return device.attributes["MultiProcessorCount"] * per_clock[precision] * clock_khz * 1e3 / 1e12


# ---- the operations, ours and PyTorch's --------------------------------------------------------

def _torch_conv(torch, mode, shape, pass_):
    """The pass through cuDNN (channels_last) as a closure, and its input tensors (NCHW, KCRS)."""
    n, h, w, c, k, r, stride, padding = shape
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    x = torch.randn(n, c, h, w, device=DEVICE, dtype=dtype).to(memory_format=torch.channels_last)
    wt = torch.randn(k, c, r, r, device=DEVICE, dtype=dtype).to(memory_format=torch.channels_last)
    gy = torch.nn.functional.conv2d(x, wt, stride=stride, padding=padding).contiguous(
        memory_format=torch.channels_last)
    if pass_ == "fwd":
        return (x, wt, gy), lambda: torch.nn.functional.conv2d(x, wt, stride=stride, padding=padding)
    mask = [pass_ == "dgrad", pass_ == "wgrad", False]
    args = (gy, x, wt, None, [stride] * 2, [padding] * 2, [1, 1], False, [0, 0], 1, mask)
    return (x, wt, gy), lambda: torch.ops.aten.convolution_backward(*args)[0 if pass_ == "dgrad" else 1]


def _to_cupy(cupy, torch, tensor):
    """A torch CUDA tensor as a contiguous channels-last CuPy array (bf16 as uint16 bits)."""
    if tensor.dim() == 4:
        tensor = tensor.permute(0, 2, 3, 1)  # NCHW -> NHWC, KCRS -> KRSC
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:
        return cupy.asarray(tensor.view(torch.int16)).view(cupy.uint16)
    return cupy.asarray(tensor)


def _agreement(cupy, torch, ours, theirs):
    """max |ours − theirs| / max |theirs| (theirs a torch tensor in its own layout)."""
    theirs = _to_cupy(cupy, torch, theirs.float())
    if ours.dtype == numpy.uint16:
        ours = (ours.astype(cupy.uint32) << 16).view(cupy.float32)
    return float(cupy.abs(ours - theirs).max() / cupy.maximum(cupy.abs(theirs).max(), 1e-30))


class NotRun(Exception):
    """An operation this run does not measure, and why (the row says "skipped")."""


def _measure(rows, row, timer, torch, setup):
    """setup() -> (ours, theirs or None, validate or None): validate, time ours and theirs, add
    the row. An exception anywhere becomes the row's error and the benchmark goes on."""
    try:
        ours, theirs, validate = setup()
        if validate is not None:
            row["max_error_vs_torch"] = validate()
        row["ms"] = timer(ours)
        if theirs is not None:
            row["torch_ms"] = timer(theirs, torch)
        if "flop" in row:
            row["tflops"] = row["flop"] / row["ms"] / 1e9
        if "bytes" in row:
            row["gbps"] = row["bytes"] / row["ms"] / 1e6
    except NotRun as why:
        row["skipped"] = str(why)
    except Exception as error:  # noqa: BLE001 - one operation failing must not end the benchmark
        row["error"] = f"{type(error).__name__}: {error}"
    rows.append(row)


def bench_convs(kernels, cupy, torch, timer, modes, batch, rows, convs=None):
    """Every pass of each convolution of `convs` (a function of the batch size; ResNet-50's by
    default) in each mode."""
    for name, shape in (convs or resnet50_convs)(batch).items():
        n, h, w, c, k, r, stride, padding = shape
        p = (h + 2 * padding - r) // stride + 1
        for mode in modes:
            kernels.allow_tf32 = mode != "fp32"
            try:
                tile = kernels.conv_tile(numpy.uint16 if mode == "bf16" else numpy.float32, c, k).name
            except ValueError as error:  # bf16 needs channel counts that are multiples of 8
                rows.append({"op": "conv", "layer": name, "mode": mode, "skipped": str(error)})
                continue
            for pass_ in ("fwd", "dgrad", "wgrad"):
                if pass_ == "dgrad" and name.startswith("conv1"):
                    continue  # the image needs no gradient

                def setup(pass_=pass_, shape=shape, mode=mode):
                    tensors, theirs = _torch_conv(torch, mode, shape, pass_)
                    x, wt, gy = (_to_cupy(cupy, torch, t) for t in tensors)
                    ours = {"fwd": lambda: kernels.conv_forward(x, wt, stride, padding),
                            "dgrad": lambda: kernels.conv_grad_input(gy, wt, x.shape, stride, padding),
                            "wgrad": lambda: kernels.conv_grad_weight(x, gy, wt.shape, stride, padding)}[pass_]
                    return ours, theirs, lambda: _agreement(cupy, torch, ours(), theirs())
                row = {"op": f"conv {pass_}", "layer": name, "mode": mode, "tile": tile,
                       "flop": 2.0 * n * p * p * k * r * r * c}
                chosen_before = set(kernels.tuner.choices) if kernels.tuner is not None else set()
                _measure(rows, row, timer, torch, setup)
                rows[-1]["plan"] = plans_chosen_since(kernels, chosen_before)
    kernels.allow_tf32 = True


def plans_chosen_since(kernels, before):
    """The plans the tuner chose for the keys it met since its choices were `before` (what a row
    ran: v1, v2 or v3), or "v1" where there is no tuner."""
    if kernels.tuner is None:
        return "v1"
    return ", ".join(kernels.tuner.choices[key].label() for key in sorted(set(kernels.tuner.choices) - before)) or None


def ladder_layers(batch):
    """The ResNet-50 layers the ladder runs: {name: (N, H, W, C, K, R, stride, padding)}."""
    return {name: shape for name, shape in resnet50_convs(batch).items() if name.startswith(LADDER_LAYERS)}


def _ladder_plan(kernels, version, conv_pass, operands, geometry):
    """The plan of one rung: v0's, v1's, or the first v2 plan that the autotuner may run (its
    canary has validated it on this device); NotRun where there is none."""
    if version == "v0":
        from minidl.kernels.conv_v0 import PLAN
        return PLAN
    offered = [plan for plan in kernels.plans(conv_pass, operands, geometry) if plan.version == version]
    if version == "v2":
        if kernels.tuner is None:
            raise NotRun("v2 runs only under the autotuner, after its canary (MINIDL_AUTOTUNE=0 here)")
        from minidl.kernels.conv_v2 import kernel_kind
        kernels.tuner.validated()
        offered = [plan for plan in offered if kernels.tuner.usable(plan, kernel_kind(conv_pass))]
    if not offered:
        raise NotRun(f"no {version} tile computes this pass here")
    return offered[0]


def bench_ladder(kernels, cupy, torch, timer, batch, rows, convs=None):
    """Each pass of each layer of `convs` (ladder_layers by default) on every rung of LADDER, the
    kernel version forced by its plan; validated against PyTorch, then timed (rows "ladder v0
    fwd", ...; PyTorch is not timed here)."""
    from minidl.kernels.conv import conv_geometry
    for name, shape in (convs or ladder_layers)(batch).items():
        n, h, w, c, k, r, stride, padding = shape
        geometry = conv_geometry((n, h, w, c), (k, r, r, c), stride, padding)
        flop = 2.0 * n * geometry[7] * geometry[8] * k * r * r * c
        for pass_ in ("fwd", "dgrad", "wgrad"):
            for version, mode in LADDER:
                def setup(pass_=pass_, shape=shape, mode=mode, version=version):
                    tensors, theirs = _torch_conv(torch, mode, shape, pass_)
                    x, wt, gy = (_to_cupy(cupy, torch, t) for t in tensors)
                    kernels.allow_tf32 = mode == "tf32"
                    conv_pass, operands = {"fwd": ("conv_fwd", (x, wt)), "dgrad": ("conv_dgrad", (gy, wt)),
                                           "wgrad": ("conv_wgrad", (x, gy))}[pass_]
                    plan = _ladder_plan(kernels, version, conv_pass, operands, geometry)
                    ours = {"fwd": lambda: kernels.conv_forward(x, wt, stride, padding, plan=plan),
                            "dgrad": lambda: kernels.conv_grad_input(gy, wt, x.shape, stride, padding, plan=plan),
                            "wgrad": lambda: kernels.conv_grad_weight(x, gy, wt.shape, stride, padding, plan=plan)}
                    return ours[pass_], None, lambda: _agreement(cupy, torch, ours[pass_](), theirs())
                _measure(rows, {"op": f"ladder {version} {pass_}", "layer": name, "mode": mode, "flop": flop},
                         timer, torch, setup)
    kernels.allow_tf32 = True


def _batch_norm_case(kernels, cupy, torch, shape, dtype):
    """{"fwd" | "bwd": (ours, theirs, validate)} for one BN shape, on the same random inputs."""
    n, h, w, channels = shape
    tx = torch.randn(n, channels, h, w, device=DEVICE, dtype=dtype).to(memory_format=torch.channels_last)
    gamma, beta = torch.rand(channels, device=DEVICE) + 0.5, torch.randn(channels, device=DEVICE)
    mean, var = torch.zeros(channels, device=DEVICE), torch.ones(channels, device=DEVICE)
    x = _to_cupy(cupy, torch, tx)
    g, b, rm, rv = (cupy.asarray(t.clone()) for t in (gamma, beta, mean, var))
    y, saved = kernels.batch_norm_forward(x, g, b, rm, rv, True, 0.1, 1e-5)
    ty, save_mean, save_invstd = torch.ops.aten.native_batch_norm(tx, gamma, beta, mean.clone(), var.clone(),
                                                                  True, 0.1, 1e-5)
    return {"fwd": (lambda: kernels.batch_norm_forward(x, g, b, rm, rv, True, 0.1, 1e-5),
                    lambda: torch.ops.aten.native_batch_norm(tx, gamma, beta, mean, var, True, 0.1, 1e-5),
                    lambda: _agreement(cupy, torch, y, ty)),
            "bwd": (lambda: kernels.batch_norm_backward(y, x, saved, True),
                    lambda: torch.ops.aten.native_batch_norm_backward(ty, tx, gamma, mean, var, save_mean,
                                                                      save_invstd, True, 1e-5, [True] * 3),
                    None)}


def bench_batch_norms(kernels, cupy, torch, timer, modes, batch, rows, shapes=None):
    """BN training forward (statistics, normalize) and backward; fp32 data unless bf16; on
    `shapes` (a function of the batch size; ResNet-50's by default)."""
    for name, shape in (shapes or resnet50_batch_norms)(batch).items():
        for mode in sorted({"bf16" if m == "bf16" else "fp32" for m in modes}):
            itemsize, dtype = (2, torch.bfloat16) if mode == "bf16" else (4, torch.float32)
            case = {}

            def setup(op, shape=shape, dtype=dtype, case=case):  # the first call makes the inputs
                if not case:
                    case.update(_batch_norm_case(kernels, cupy, torch, shape, dtype))
                return case[op]
            size = math.prod(shape) * itemsize
            _measure(rows, {"op": "bn fwd", "layer": name, "mode": mode, "bytes": 3 * size},  # x twice, y once
                     timer, torch, lambda: setup("fwd"))
            _measure(rows, {"op": "bn bwd", "layer": name, "mode": mode, "bytes": 5 * size},  # dy, x twice; dx
                     timer, torch, lambda: setup("bwd"))


def bench_sgd(kernels, cupy, torch, timer, rows, parameters=None):
    n = round_up(parameters or PARAMETERS_RESNET50, 1024)  # the flat buffer, as FlatParameters pads it
    rng = cupy.random.default_rng(0)
    w, g, u = (rng.standard_normal(n, dtype=cupy.float32) for _ in range(3))
    decay = cupy.full(n, 1e-4, dtype=cupy.float32)
    theirs = None
    if torch is not None:
        tw = torch.nn.Parameter(torch.randn(n, device=DEVICE))
        tw.grad = torch.randn(n, device=DEVICE)
        try:
            optimizer = torch.optim.SGD([tw], lr=0.1, momentum=0.9, weight_decay=1e-4, fused=True)
        except (TypeError, RuntimeError):  # a PyTorch without fused SGD
            optimizer = torch.optim.SGD([tw], lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=True)
        optimizer.step()  # creates the momentum buffer
        theirs = optimizer.step
    row = {"op": "sgd", "layer": f"{n} parameters", "mode": "fp32", "bytes": 6 * 4 * n}  # w g u λ read, w u written
    _measure(rows, row, timer, torch,
             lambda: (lambda: kernels.sgd_momentum_update(w, g, u, 0.1, 0.9, 1.0, decay, False), theirs, None))


# ---- report ------------------------------------------------------------------------------------

def geomean(values):
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values))


def summarize(rows, ceilings):
    """Ratios (torch time / our time: > 1 is faster than PyTorch) and the target summaries."""
    for row in rows:
        if "torch_ms" in row and row.get("ms"):
            row["vs_torch"] = row["torch_ms"] / row["ms"]
        if "tflops" in row and ceilings.get(row["mode"]):
            row["of_peak"] = row["tflops"] / ceilings[row["mode"]]
        if "gbps" in row and ceilings.get("copy_gbps"):
            row["of_copy_bandwidth"] = row["gbps"] / ceilings["copy_gbps"]
    summary = {}
    for key in sorted({(r["op"], r["mode"]) for r in rows if "vs_torch" in r}):
        summary[f"{key[0]} {key[1]} geomean vs torch"] = geomean(r["vs_torch"] for r in rows
                                                                 if (r["op"], r["mode"]) == key and "vs_torch" in r)
    conv = [r for r in rows if r["op"].startswith("conv") and "vs_torch" in r and r["mode"] != "fp32"]
    if conv:
        summary["conv geomean vs cuDNN (target >= 0.5)"] = geomean(r["vs_torch"] for r in conv)
    for version in ("v2", "v3"):
        on_version = [r["vs_torch"] for r in conv if str(r.get("plan")).startswith(version + ":")]
        if on_version:
            summary[f"conv on {version} plans ({len(on_version)}) geomean vs cuDNN"] = geomean(on_version)
    for op, target in (("bn", 0.7), ("sgd", 0.8)):
        shares = [r["of_copy_bandwidth"] for r in rows if r["op"].startswith(op) and "of_copy_bandwidth" in r]
        if shares:
            summary[f"{op} median share of copy bandwidth (target >= {target})"] = statistics.median(shares)
    return summary


def format_table(rows, ceilings, summary):
    lines = ["device ceilings: " + ", ".join(f"{k} {v:.0f}" for k, v in ceilings.items() if v),
             f"{'op':16} {'layer':34} {'mode':5} {'ms':>8} {'rate':>13} {'of ceil':>8} {'torch ms':>9} "
             f"{'vs torch':>8} {'err':>8}"]
    for r in rows:
        if "skipped" in r or "error" in r:
            lines.append(f"{r['op']:16} {r['layer'][:34]:34} {r['mode']:5} {r.get('skipped') or r['error']}")
            continue
        rate = f"{r['tflops']:.1f} TFLOP/s" if "tflops" in r else f"{r['gbps']:.0f} GB/s"
        share = r.get("of_peak", r.get("of_copy_bandwidth"))
        lines.append(f"{r['op']:16} {r['layer'][:34]:34} {r['mode']:5} {r['ms']:8.3f} {rate:>13} "
                     f"{'' if share is None else f'{share:.0%}':>8} {r.get('torch_ms', float('nan')):9.3f} "
                     f"{r.get('vs_torch', float('nan')):8.2f} {r.get('max_error_vs_torch', float('nan')):8.1e}")
    lines += [f"{k}: {v:.2f}" for k, v in summary.items()]
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m minidl.bench kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--runs", type=int, default=20, help="timed runs per operation (the median is reported)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default="tf32,bf16", help="comma-separated: tf32 (fp32 data), bf16, fp32 (exact)")
    p.add_argument("--only", default="conv,bn,sgd,ladder",
                   help="comma-separated: conv, bn, sgd, ladder (convolution kernels v0, v1, v2 side by side)")
    p.add_argument("--shapes", choices=("resnet50", "small"), default="resnet50",
                   help="ResNet-50's layers at --batch-size, or a few tiny ones (for an emulated device)")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="print one JSON object instead of a table; with FILE, write it there after every "
                        "operation (a run cut short keeps what it measured)")
    args = p.parse_args(argv)
    if args.json not in (None, "-"):  # before measuring, not after
        writable("--json", args.json)
    args.modes = [m for m in args.modes.split(",") if m]
    if args.runs < 1 or set(args.modes) - {"tf32", "bf16", "fp32"}:
        raise UserError("--runs must be >= 1 and --modes a list of tf32, bf16, fp32")
    return args


def main(argv):
    global DEVICE
    args = parse_args(argv)
    kernels, cupy = device_kernels()  # cupy: NumPy beside an emulated device
    emulated = cupy is numpy
    DEVICE = "cpu" if emulated else "cuda"
    try:
        import torch
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    timer = HostTimer(args.runs, args.warmup) if emulated else Timer(cupy, args.runs, args.warmup)
    if emulated:
        name = "emulated device (CPU)"
    else:
        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    small = args.shapes == "small"
    report = {"device": name.decode() if isinstance(name, bytes) else name, "batch_size": args.batch_size,
              "shapes": args.shapes, "runs": args.runs, "warmup": args.warmup, "ceilings": {}, "summary": {},
              "rows": []}
    rows, ceilings = report["rows"], report["ceilings"]
    ceilings["copy_gbps"] = copy_bandwidth(cupy, timer, 1 << 20 if small else 256 << 20)
    ceilings.update({mode: None if emulated else peak_tflops(cupy, mode) for mode in ("fp32", "tf32", "bf16")})

    class Progress(list):  # rows that rewrite the report file as they arrive
        def append(self, row):
            super().append(row)
            if args.json not in (None, "-"):
                report["rows"], report["summary"] = list(self), summarize(list(self), ceilings)
                write_json_atomic(args.json, report)

    rows = Progress()
    if args.json not in (None, "-"):  # the device and its ceilings, before the first operation
        write_json_atomic(args.json, report)
    only = set(args.only.split(","))
    if torch is None and only & {"conv", "bn", "ladder"}:
        print("PyTorch is not importable: convolutions and batch norm need it for their inputs and "
              "validation; only SGD is measured", file=sys.stderr)
    if torch is not None and "conv" in only:
        bench_convs(kernels, cupy, torch, timer, args.modes, args.batch_size, rows, small_convs if small else None)
    if torch is not None and "bn" in only:
        bench_batch_norms(kernels, cupy, torch, timer, args.modes, args.batch_size, rows,
                          small_batch_norms if small else None)
    if "sgd" in only:
        bench_sgd(kernels, cupy, torch, timer, rows, SMALL_PARAMETERS if small else None)
    if torch is not None and "ladder" in only:
        bench_ladder(kernels, cupy, torch, timer, args.batch_size, rows, small_convs if small else None)
    report["rows"], report["summary"] = list(rows), summarize(list(rows), ceilings)
    if args.json == "-":
        print(json.dumps(report))
        return 0
    if args.json is not None:
        write_json_atomic(args.json, report)
    print(format_table(report["rows"], ceilings, report["summary"]))
    return 0
