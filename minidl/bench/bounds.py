"""`python -m minidl.bench bounds [--batch-size 256] [--json FILE] [--no-nvcc]`: the
least time each ResNet-50 convolution can take on an H200, per pass and bf16 tile — bounds from
the datasheet, not measurements.

Per layer, pass and bf16 tile (v2's and v3's, from their launchers, with the splits each
launcher offers): tiles per SM by shared memory, registers and threads; waves and their
quantization; operand bytes per k-step against HBM; the tensor-core time at the datasheet peak
and the compulsory HBM traffic's time, the larger of which binds.

Details: docs/kernels.md, "minidl/bench/bounds.py".
"""
import json
from dataclasses import dataclass

import numpy

from minidl.backend import BF16
from minidl.bench._nvcc import compile_cubin, find_nvcc
from minidl.bench.kernels import resnet50_convs
from minidl.cli import OneLineErrorParser
from minidl.errors import UserError
from minidl.fileio import writable, write_json_atomic
from minidl.intmath import ceil_div, round_up
from minidl.kernels import Kernels, conv_v2, conv_v3, loader
from minidl.kernels.conv import conv_geometry

BF16_BYTES = 2


@dataclass(frozen=True)
class Device:
    name: str
    multiprocessors: int
    bf16_flops: float            # dense tensor-core FLOP/s
    hbm_bytes: float             # bytes/s
    l2_bytes: int
    smem_per_sm: int
    smem_per_block: int          # the most one block may opt in to
    smem_reserved_per_block: int  # the runtime's own, beside each block's
    registers_per_sm: int
    register_granularity: int    # registers per thread are allocated in multiples of this
    max_threads_per_sm: int
    max_blocks_per_sm: int


# NVIDIA's H200 SXM datasheet: 1,979 TFLOP/s bf16 "with sparsity" (dense: half, i.e. 132 SMs ×
# 4096 FLOP per clock × 1.83 GHz), 4.8 TB/s HBM3e; the CUDA programming guide for compute
# capability 9.0: 228 KiB of shared memory per SM (227 KiB per block, 1 KiB reserved per block),
# 64 Ki registers, 2048 threads and 32 blocks per SM. L2: 60 MiB as PyTorch read it on this
# workplace's H200s (the H100 SXM has 50 MiB).
H200 = Device("NVIDIA H200 SXM", 132, 1979e12 / 2, 4.8e12, 60 << 20, 228 << 10, 227 << 10, 1 << 10, 65536, 8, 2048,
              32)
PASSES = conv_v2.PASSES
PASS_NAMES = {"conv_fwd": "fwd", "conv_dgrad": "dgrad", "conv_wgrad": "wgrad"}


@dataclass(frozen=True)
class Tile:
    """A bf16 tile as the bound sees it: `family` its Plan version ("v2", "v3"), `name` its tile
    in that family's launcher. `registers`: per pass, registers per block, where known (v2:
    ptxas's count per thread; v3: its warpgroups' setmaxnreg targets)."""
    name: str
    family: str
    bm: int
    bn: int
    bk: int
    stages: int
    threads: int
    smem_bytes: int
    registers: tuple = ()  # ((pass, registers per block), ...)

    def block_registers(self, conv_pass):
        return dict(self.registers).get(conv_pass)


def v2_tiles(registers_per_thread=None):
    """The v2 launcher's bf16 tiles; `registers_per_thread`: {(tile, pass): count} from ptxas."""
    tiles = []
    for tile in conv_v2.TILES.values():
        if tile.dtype != BF16:
            continue
        registers = tuple((p, tile.threads * round_up(registers_per_thread[(tile.name, p)], H200.register_granularity))
                          for p in PASSES if registers_per_thread and (tile.name, p) in registers_per_thread)
        tiles.append(Tile(tile.name, "v2", tile.bm, tile.bn, tile.bk, tile.stages, tile.threads, tile.smem_bytes,
                          registers))
    return tiles


def v3_tiles():
    """The v3 launcher's tiles (conv_v3.TILES): a producer warpgroup and `consumers` consumer
    warpgroups, each at its setmaxnreg target (the registers a block holds once they ran), and
    the shared memory of the stages and their mbarriers."""
    return [Tile(tile.name, "v3", tile.bm, tile.bn, tile.bk, tile.stages, tile.threads, tile.smem_bytes,
                 tuple((p, 128 * (tile.producer_regs + tile.consumers * tile.consumer_regs)) for p in PASSES))
            for tile in conv_v3.TILES.values()]


def ptxas_registers():
    """{(tile, pass): registers per thread} of the v2 bf16 kernels (no batch-norm fusion), by nvcc."""
    wanted = {t.kernel(p): (t.name, p) for t in conv_v2.TILES.values() if t.dtype == BF16 for p in PASSES}
    compiled = compile_cubin(loader.source_path(conv_v2.FAMILY), list(wanted), loader.compile_options(conv_v2.DEFINES))
    if compiled.returncode != 0:
        raise UserError(f"nvcc failed on {conv_v2.FAMILY}: {compiled.log.strip().splitlines()[-1]} (--no-nvcc: "
                        "tiles per SM without the registers)")
    by_name = {name.replace(" ", ""): r["registers"] for name, r in compiled.resources.items()}
    return {key: by_name[name.replace(" ", "")] for name, key in wanted.items()}


def tiles_per_sm(device, tile, block_registers):
    """(resident blocks per SM, what limits them: "smem", "registers" (where known), "threads",
    "blocks", each that allows no more, comma-separated)."""
    fits = tile.smem_bytes <= device.smem_per_block
    limits = {"smem": device.smem_per_sm // (tile.smem_bytes + device.smem_reserved_per_block) if fits else 0,
              "threads": device.max_threads_per_sm // tile.threads, "blocks": device.max_blocks_per_sm}
    if block_registers:
        limits["registers"] = device.registers_per_sm // block_registers
    fewest = min(limits.values())
    return fewest, ", ".join(name for name, count in limits.items() if count == fewest)


def gemm_phases(conv_pass, geometry):
    """[(rows, columns, reduction)]: the implicit GEMMs of a pass as the kernels compute them
    (kernels/conv.cu's opening comment): forward N·P·Q × K over R·S·C; grad-weight K × R·S·C over
    N·P·Q; grad-input one per stride² phase (ph, pw): its pixels × C over its taps × K."""
    n, h, w, c, k, r, s, p, q, stride, pad = geometry
    if conv_pass == "conv_fwd":
        return [(n * p * q, k, r * s * c)]
    if conv_pass == "conv_wgrad":
        return [(k, r * s * c, n * p * q)]
    return [(n * ceil_div(h - ph, stride) * ceil_div(w - pw, stride), c,
             ceil_div(r - (ph + pad) % stride, stride) * ceil_div(s - (pw + pad) % stride, stride) * k)
            for ph in range(stride) for pw in range(stride)]


def hbm_bytes(conv_pass, geometry, splits):
    """Bytes the pass must move through HBM at least: each operand read once, the output written
    once (grad-weight's in fp32); split-K's fp32 partial sums written and read back."""
    n, h, w, c, k, r, s, p, q = geometry[:9]
    image, weight, gradient = n * h * w * c, k * r * s * c, n * p * q * k
    out = {"conv_fwd": gradient, "conv_dgrad": image, "conv_wgrad": weight}[conv_pass]
    moved = (image + weight + gradient) * BF16_BYTES + (weight * 2 if conv_pass == "conv_wgrad" else 0)
    return moved + (2 * splits * out * 4 if splits > 1 else 0)


def operand_bandwidth(device, tile):
    """Bytes per second the tile's operands need (from L2, or HBM) to keep the tensor cores at peak:
    (BM + BN)·BK bf16 per k-step of 2·BM·BN·BK FLOP."""
    return device.bf16_flops * (tile.bm + tile.bn) * tile.bk * BF16_BYTES / (2 * tile.bm * tile.bn * tile.bk)


def bound(device, tile, conv_pass, geometry, splits):
    """One row: the tensor-core time of the tile's padded work at the datasheet peak in whole
    waves (a last partial wave lasting as long as a full one; blocks treated as equal), the
    compulsory HBM time, the larger one binding."""
    phases = gemm_phases(conv_pass, geometry)
    largest = max(rows for rows, _, _ in phases)
    blocks = len(phases) * ceil_div(largest, tile.bm) * ceil_div(phases[0][1], tile.bn) * splits
    padded = sum(2 * round_up(rows, tile.bm) * round_up(cols, tile.bn) * round_up(red, tile.bk)
                 for rows, cols, red in phases)
    useful = sum(2 * rows * cols * red for rows, cols, red in phases)
    per_sm, limit = tiles_per_sm(device, tile, tile.block_registers(conv_pass))
    slots = per_sm * device.multiprocessors
    waves = ceil_div(blocks, slots) if slots else 0
    quantization = blocks / (waves * slots) if slots else 0.0
    tensor = padded / device.bf16_flops / quantization if slots else float("inf")
    memory = hbm_bytes(conv_pass, geometry, splits) / device.hbm_bytes
    return {"tile": tile.name, "family": tile.family, "splits": splits, "blocks": blocks, "tiles_per_sm": per_sm,
            "limited_by": limit, "waves": blocks / slots if slots else None, "quantization": quantization,
            "useful_gflop": useful / 1e9, "padded_gflop": padded / 1e9, "tensor_us": tensor * 1e6,
            "hbm_us": memory * 1e6, "bound_us": max(tensor, memory) * 1e6,
            "binds": "tensor" if tensor >= memory else "HBM",
            "of_peak": useful / device.bf16_flops / max(tensor, memory)}


def offered_splits(device, conv_pass, geometry):
    """{(family, tile): the splits its launcher offers here} (bf16 v2 and v3; tiles that do not
    fit are absent)."""
    stand_in = numpy.empty(0, dtype=BF16)
    try:
        plans = Kernels(None, device.multiprocessors).plans(conv_pass, (stand_in, stand_in), geometry)
    except ValueError:  # channel counts no bf16 kernel takes (the 3-channel stem)
        return {}
    found = {}
    for plan in plans:
        if plan.version != "v1":
            found.setdefault((plan.version, plan.tile), []).append(plan.splits)
    return found


def layer_rows(device, tiles, name, shape, conv_pass):
    """Every tile's best row (over the splits offered) for one layer and pass; where no tile
    serves it, one row of family None."""
    n, h, w, c, k, r, stride, pad = shape
    geometry = conv_geometry((n, h, w, c), (k, r, r, c), stride, pad)
    offered = offered_splits(device, conv_pass, geometry)
    rows = []
    for tile in tiles:
        candidates = [bound(device, tile, conv_pass, geometry, s) for s in offered.get((tile.family, tile.name), ())]
        if candidates:
            rows.append({"layer": name, "pass": PASS_NAMES[conv_pass], **min(candidates, key=lambda r: r["bound_us"])})
    useful = 2 * n * k * r * r * c * geometry[7] * geometry[8] / 1e9
    return rows or [{"layer": name, "pass": PASS_NAMES[conv_pass], "family": None, "useful_gflop": useful}]


def all_rows(device, tiles, batch):
    rows = []
    for name, shape in resnet50_convs(batch).items():
        for conv_pass in PASSES:
            if conv_pass == "conv_dgrad" and name.startswith("conv1"):
                continue  # the image needs no gradient
            rows += layer_rows(device, tiles, name, shape, conv_pass)
    return rows


# ---- report ------------------------------------------------------------------------------------

def layer_count(name):
    return int(name.rsplit("(x", 1)[1].rstrip(")")) if "(x" in name else 1


def best_per_family(rows):
    """{(layer, pass): {family: best row}} in layer order."""
    best = {}
    for row in rows:
        entry = best.setdefault((row["layer"], row["pass"]), {"useful_gflop": row["useful_gflop"]})
        if row["family"] is not None and (row["family"] not in entry or row["bound_us"] < entry[row["family"]]["bound_us"]):
            entry[row["family"]] = row
    return best


def tile_table(device, tiles):
    lines = ["| tile | family | threads | smem KiB | registers per block (fwd, dgrad, wgrad) | tiles per SM | "
             "operand bytes per k-step | operands at peak TB/s | from L2 at least |",
             "|---|---|---|---|---|---|---|---|---|"]
    for tile in tiles:
        registers = [tile.block_registers(p) for p in PASSES]
        per_sm = sorted({"{} ({})".format(*tiles_per_sm(device, tile, r)) for r in registers})
        need = operand_bandwidth(device, tile)
        lines.append(f"| {tile.name} | {tile.family} | {tile.threads} | {tile.smem_bytes / 1024:g} | "
                     f"{', '.join(str(r) if r else '?' for r in registers)} | {', '.join(per_sm)} | "
                     f"{(tile.bm + tile.bn) * tile.bk * BF16_BYTES} | {need / 1e12:.1f} | "
                     f"{max(0.0, 1 - device.hbm_bytes / need):.0%} |")
    return lines


def layer_table(rows, families):
    header = "| layer | pass | GFLOP |" + "".join(f" {f}: tile·splits | waves | quant. | µs | binds | of peak |"
                                                  for f in families)
    lines = [header, "|" + "---|" * (3 + 6 * len(families))]
    totals = {f: 0.0 for f in families}
    for (layer, conv_pass), best in best_per_family(rows).items():
        useful = best["useful_gflop"]
        cells = []
        for family in families:
            row = best.get(family)
            if row is None:
                cells.append(" — | | | | | |")
                continue
            totals[family] += layer_count(layer) * row["bound_us"]
            cells.append(f" {row['tile']}·{row['splits']} | {row['waves']:.2f} | {row['quantization']:.0%} | "
                         f"{row['bound_us']:.1f} | {row['binds']} | {row['of_peak']:.0%} |")
        lines.append(f"| {layer} | {conv_pass} | {useful:.1f} |" + "".join(cells))
    lines.append("| the layers served, each as often as it occurs in the network | | |" +
                 "".join(f" | | | {totals[f]:.0f} | | |" for f in families))
    return lines


def report(device, tiles, rows, batch, registers_known):
    families = list(dict.fromkeys(t.family for t in tiles))
    return "\n".join([
        f"Bounds, not measurements: {device.name}, {device.bf16_flops / 1e12:.1f} TFLOP/s dense bf16, "
        f"{device.hbm_bytes / 1e12:.1f} TB/s HBM, {device.multiprocessors} SMs, ResNet-50 at batch {batch} per GPU"
        + ("" if registers_known else " (v2 registers unknown: tiles per SM without them)"), "",
        *tile_table(device, tiles), "", *layer_table(rows, families)])


def parse_args(argv):
    parser = OneLineErrorParser(prog="python -m minidl.bench bounds", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=256, help="images per GPU")
    parser.add_argument("--json", metavar="FILE", help="also write every tile's row of every layer and pass here")
    parser.add_argument("--no-nvcc", action="store_true",
                        help="do not compile the v2 kernels for their register counts")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        raise UserError(f"--batch-size {args.batch_size}: give a positive number of images")
    if args.json:
        writable("--json", args.json)
    return args


def main(argv):
    args = parse_args(argv)
    registers = None if args.no_nvcc or find_nvcc() is None else ptxas_registers()
    tiles = v2_tiles(registers) + v3_tiles()
    rows = all_rows(H200, tiles, args.batch_size)
    print(report(H200, tiles, rows, args.batch_size, registers is not None))
    if args.json:
        write_json_atomic(args.json, {"device": H200.__dict__, "batch_size": args.batch_size,
                                      "tiles": [t.__dict__ for t in tiles], "rows": rows})
    return 0
