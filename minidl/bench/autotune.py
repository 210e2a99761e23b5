"""`python -m minidl.bench autotune`: every plan of every ResNet-50 convolution, timed on the GPU.

For each distinct convolution of ResNet-50 at each batch size and each pass, the autotuner of
minidl.kernels times every candidate plan (the v1 kernel, each v2 tile and split that fits) on
random inputs and keeps the fastest, as a training run's first step would; the table gives the
v1 time, the best v2 time, their ratio and the choice. The choices land in the tuner's cache
(MINIDL_CACHE/autotune/...), so a run or benchmark after this one starts tuned.
"""
import argparse
import json
import sys

import numpy

from minidl.bench.kernels import resnet50_convs
from minidl.errors import UserError
from minidl.fileio import writable, write_json_atomic
from minidl.kernels.conv_v2 import PASSES



def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m minidl.bench autotune", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", default="256,32", help="comma-separated")
    p.add_argument("--modes", default="bf16", help="comma-separated: bf16, tf32")
    p.add_argument("--json", help="write every timing and choice here")
    args = p.parse_args(argv)
    if args.json:  # before measuring, not after
        writable("--json", args.json)
    try:
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        raise UserError(f"--batch-sizes {args.batch_sizes!r} is not a comma-separated list of integers") from None
    args.modes = args.modes.split(",")
    if set(args.modes) - {"bf16", "tf32"} or min(args.batch_sizes) < 1:
        raise UserError("--modes takes bf16 and tf32, --batch-sizes positive integers")
    return args


def operands(cupy, conv_pass, mode, shape):
    """Random inputs of one pass: (call(plan) -> output, geometry's call) on the device."""
    n, h, w, c, k, r, stride, padding = shape
    p = (h + 2 * padding - r) // stride + 1
    rng = cupy.random.default_rng(0)

    def draw(dims):
        values = rng.standard_normal(dims, dtype=numpy.float32)
        return values if mode == "tf32" else (values.view(numpy.uint32) >> 16).astype(numpy.uint16)  # bf16 bits

    x, wt, gy = draw((n, h, w, c)), draw((k, r, r, c)), draw((n, p, p, k))
    return {"conv_fwd": lambda gpu: gpu.conv_forward(x, wt, stride, padding),
            "conv_dgrad": lambda gpu: gpu.conv_grad_input(gy, wt, x.shape, stride, padding),
            "conv_wgrad": lambda gpu: gpu.conv_grad_weight(x, gy, wt.shape, stride, padding)}[conv_pass]


def row_of(key, timings, choice):
    v1 = min((s for label, s in timings.items() if label.startswith("v1")), default=None)
    v2 = min((s for label, s in timings.items() if label.startswith("v2")), default=None)
    return {"key": key, "v1_ms": v1 and 1e3 * v1, "best_v2_ms": v2 and 1e3 * v2,
            "v2_speedup": v1 / v2 if v1 and v2 else None, "choice": choice, "plans_ms": {
                label: 1e3 * s for label, s in timings.items()}}


def format_table(rows):
    lines = [f"{'pass, dtype, geometry':58} {'v1 ms':>8} {'v2 ms':>8} {'v1/v2':>6}  choice"]
    for r in rows:
        cells = [f"{r[f]:8.3f}" if r[f] is not None else f"{'-':>8}" for f in ("v1_ms", "best_v2_ms")]
        speedup = f"{r['v2_speedup']:6.2f}" if r["v2_speedup"] else f"{'-':>6}"
        lines.append(f"{r['key'][:58]:58} {cells[0]} {cells[1]} {speedup}  {r['choice']}")
    return "\n".join(lines)


def main(argv):
    args = parse_args(argv)
    from minidl import backend, kernels
    if not backend.on_gpu:
        raise UserError("the autotuning benchmark times kernels on a CUDA GPU, and there is none here: run it on "
                        "a GPU machine")
    import cupy
    gpu = kernels.device()
    if gpu.tuner is None:
        raise UserError("MINIDL_AUTOTUNE=0 turns the autotuner off: unset it to time the plans")
    rows = []
    for batch in args.batch_sizes:
        for name, shape in resnet50_convs(batch).items():
            for mode in args.modes:
                for conv_pass in PASSES:
                    if (conv_pass == "conv_dgrad" and name.startswith("conv1")) or shape[3] % 8:
                        continue  # the image needs no gradient; the stem's 3 channels run on v1's SIMT tile
                    before = set(gpu.tuner.choices)
                    operands(cupy, conv_pass, mode, shape)(gpu)
                    for key in set(gpu.tuner.choices) - before:
                        rows.append(row_of(key, gpu.tuner.timings.get(key, {}), gpu.tuner.choices[key].label()))
                        print(format_table(rows[-1:]).splitlines()[1], flush=True)
    report = {**gpu.tuner.report(), "rows": rows}
    if args.json:
        write_json_atomic(args.json, report)
    print(format_table(rows))
    speedups = [r["v2_speedup"] for r in rows if r["v2_speedup"]]
    if speedups:
        geomean = float(numpy.exp(numpy.mean(numpy.log(speedups))))
        print(f"{len(rows)} shapes tuned in {report['seconds']:.1f} s; v1/v2 geometric mean {geomean:.2f}; "
              f"v2 chosen for {sum(r['choice'].startswith('v2') for r in rows)} of them; cache {report['cache']}")
    json.dump({"tuned": report["tuned"], "seconds": report["seconds"]}, sys.stdout)
    print()
    return 0
