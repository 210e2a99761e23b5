"""`python -m minidl.bench autotune`: every plan of every ResNet-50 convolution, timed on the GPU.

For each ResNet-50 convolution, batch size and pass, the autotuner of minidl.kernels validates
the v2 and v3 kernels (the canary), checks and times every candidate plan against v1 and keeps
the fastest, as a training run's first step would; each row gives the v1 time, the best v2 and
v3 times, their ratios to v1 and the choice, and the choices land in the tuner's cache.

Details: docs/kernels.md, "minidl/bench/autotune.py".
"""
import argparse
import json
import sys

import numpy

from minidl.bench.kernels import device_kernels, resnet50_convs, small_convs
from minidl.errors import UserError
from minidl.fileio import writable, write_json_atomic
from minidl.kernels.conv import LATER_VERSIONS
from minidl.kernels.conv_v2 import PASSES


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m minidl.bench autotune", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", default="256,32", help="comma-separated (ResNet-50 shapes)")
    p.add_argument("--shapes", choices=("resnet50", "small"), default="resnet50",
                   help="small: a few small convolutions (for the CPU emulator)")
    p.add_argument("--modes", default="bf16", help="comma-separated: bf16, tf32")
    p.add_argument("--json", help="write every candidate and choice here (after every row)")
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


def shapes(args):
    """[(name, shape)] to tune."""
    if args.shapes == "small":
        return list(small_convs(2).items())
    return [item for batch in args.batch_sizes for item in resnet50_convs(batch).items()]


def operands(xp, conv_pass, mode, shape):
    """Random inputs of one pass on the device: call(kernels) runs it."""
    n, h, w, c, k, r, stride, padding = shape
    p = (h + 2 * padding - r) // stride + 1
    rng = xp.random.default_rng(0)

    def draw(dims):
        values = rng.standard_normal(dims, dtype=numpy.float32)
        return values if mode == "tf32" else (values.view(numpy.uint32) >> 16).astype(numpy.uint16)  # bf16 bits

    x, wt, gy = draw((n, h, w, c)), draw((k, r, r, c)), draw((n, p, p, k))
    return {"conv_fwd": lambda kernels: kernels.conv_forward(x, wt, stride, padding),
            "conv_dgrad": lambda kernels: kernels.conv_grad_input(gy, wt, x.shape, stride, padding),
            "conv_wgrad": lambda kernels: kernels.conv_grad_weight(x, gy, wt.shape, stride, padding)}[conv_pass]


def fastest_ms(rows, version):
    """The best time of the version's timed candidates, or None."""
    return min((r["ms"] for r in rows if r["plan"].startswith(version + ":") and r["ms"] is not None), default=None)


def row_of(key, candidates, choice):
    """One key's row: every candidate {plan, status, ms, max_error, error}, v1 against the best of
    each later version (best_v2_ms, v2_speedup = v1 / v2, and v3's)."""
    rows = [{"plan": c["plan"], "status": c["status"], "ms": None if c["seconds"] is None else 1e3 * c["seconds"],
             "max_error": c["max_error"], "error": c["error"]} for c in candidates]
    row = {"key": key, "v1_ms": fastest_ms(rows, "v1")}
    for version in LATER_VERSIONS:
        best = fastest_ms(rows, version)
        row.update({f"best_{version}_ms": best, f"{version}_speedup": row["v1_ms"] / best if row["v1_ms"] and best
                    else None})
    return {**row, "choice": choice, "candidates": rows}


def format_row(r):
    times = [r[f] for f in ("v1_ms", *(f"best_{v}_ms" for v in LATER_VERSIONS))]
    speedups = [r[f"{v}_speedup"] for v in LATER_VERSIONS]
    refused = [c["plan"] for c in r["candidates"] if c["status"] != "ok"]
    return (f"{r['key'][:58]:58} " + " ".join(f"{t:8.3f}" if t is not None else f"{'-':>8}" for t in times) + " " +
            " ".join(f"{x:6.2f}" if x else f"{'-':>6}" for x in speedups) + f"  {r['choice']}" +
            (f"  (not usable: {', '.join(refused)})" if refused else ""))


HEADER = (f"{'pass, dtype, geometry':58} {'v1 ms':>8} " + " ".join(f"{v + ' ms':>8}" for v in LATER_VERSIONS) + " " +
          " ".join(f"{'v1/' + v:>6}" for v in LATER_VERSIONS) + "  choice")


def main(argv):
    args = parse_args(argv)
    kernels, xp = device_kernels()
    if kernels.tuner is None:
        raise UserError("MINIDL_AUTOTUNE=0 turns the autotuner off: unset it to time the plans")
    rows = []

    def write():
        if args.json:
            write_json_atomic(args.json, {**kernels.tuner.report(), "rows": rows})

    write()
    print(HEADER, flush=True)
    for name, shape in shapes(args):
        for mode in args.modes:
            for conv_pass in PASSES:
                if (conv_pass == "conv_dgrad" and name.startswith("conv1")) or shape[3] % 8:
                    continue  # the image needs no gradient; the stem's 3 channels run on v1's SIMT tile
                before = set(kernels.tuner.choices)
                operands(xp, conv_pass, mode, shape)(kernels)
                for key in sorted(set(kernels.tuner.choices) - before):
                    rows.append(row_of(key, kernels.tuner.candidates.get(key, []), kernels.tuner.choices[key].label()))
                    write()
                    print(format_row(rows[-1]), flush=True)
    report = kernels.tuner.report()
    write()
    print(f"{len(rows)} shapes tuned in {report['seconds']:.1f} s; cache {report['cache']}")
    for version in LATER_VERSIONS:
        speedups = [r[f"{version}_speedup"] for r in rows if r[f"{version}_speedup"]]
        if speedups:
            geomean = float(numpy.exp(numpy.mean(numpy.log(speedups))))
            print(f"v1/{version} geometric mean {geomean:.2f} over the {len(speedups)} shapes it ran; {version} "
                  f"chosen for {sum(r['choice'].startswith(version + ':') for r in rows)} of {len(rows)}")
    json.dump({"tuned": report["tuned"], "seconds": report["seconds"]}, sys.stdout)
    print()
    return 0
