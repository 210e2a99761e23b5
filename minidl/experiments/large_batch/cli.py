"""The command line: flags -> Design, the device, then the study (or the rate sweep) and its outputs."""
import argparse
import dataclasses
import os
import subprocess
import sys

from minidl.cli import run_command
from minidl.data.embedded import DIFFICULTIES
from minidl.environment import cache_dir as default_cache_dir
from minidl.errors import UserError
from minidl.experiments.large_batch import PROG
from minidl.experiments.large_batch.listing import listing
from minidl.experiments.large_batch.store import cpu_flags
from minidl.fileio import writable
from minidl.models import MODELS
from minidl.experiments.large_batch.rows import (DEFAULT_PARTS, LARS_MULTIPLES, N, PARTS, Design, batch_rows,
                                                 config_for, control_rows, lars_rows, protocol_tuning_rows,
                                                 smoothing_rows, warmup_rows)

DEFAULTS = Design()


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2, like every other user error
        raise UserError(f"{message}: see {PROG} --help")


def numbers(kind):
    def parse(text):
        try:
            return tuple(kind(item) for item in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {kind.__name__}s") from None
    return parse


def parse_args(argv):
    from minidl.experiments import large_batch
    p = Parser(prog=PROG, description=large_batch.__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default="runs/large_batch", help="runs, results.json, table.md, figures")
    p.add_argument("--cache-dir", default=default_cache_dir(), help="where the embedded dataset is made")
    p.add_argument("--device", choices=("cpu", "gpu"), help="default: the engine's choice (MINIDL_DEVICE)")
    p.add_argument("--seeds", type=numbers(int), default=DEFAULTS.seeds,
                   help="of the warmup and batch-size-control rows (and --lr-sweep), comma-separated")
    p.add_argument("--batch-seeds", type=numbers(int), default=DEFAULTS.batch_seeds,
                   help="of the error-vs-batch rows, comma-separated")
    p.add_argument("--lr", type=float, default=DEFAULTS.lr, help=f"the reference rate, per {N} images")
    p.add_argument("--lr-sweep", type=numbers(float), metavar="RATES",
                   help=f"instead of the study: train k·n = {N} at each reference rate and name the best")
    p.add_argument("--parts", type=numbers(int), default=DEFAULT_PARTS,
                   help="which parts to run and report, comma-separated (part 1 always: B* rests on it; part 6 "
                        "only where named)")
    p.add_argument("--list", action="store_true",
                   help="print the runs of part 1 and part 6 the command would make, and which are done, then stop")
    p.add_argument("--tune", choices=("sgd", "lars", "label-noise"), default="sgd",
                   help="with --lr-sweep: the rate of SGD (--lr), of LARS (--lars-lr) or of SGD on part 5's noisy "
                        "data (--ls-lr)")
    p.add_argument("--tune-batch", type=int, default=N, help=f"with --lr-sweep: the global batch k·n it trains")
    p.add_argument("--lars-lr", type=float, default=DEFAULTS.lars_lr, help=f"LARS's reference rate, per {N} images")
    p.add_argument("--wd", "--weight-decay", dest="weight_decay", type=float, default=DEFAULTS.weight_decay,
                   help="weight decay (none on BN and biases)")
    p.add_argument("--max-batch", type=int, default=DEFAULTS.max_batch, help=f"the largest global batch, {N}·2^j")
    p.add_argument("--micro-batch", type=int, default=DEFAULTS.micro_batch,
                   help=f"images per forward pass, a multiple of {N} (BN over each {N})")
    p.add_argument("--epochs", type=int, default=DEFAULTS.epochs)
    p.add_argument("--warmup-epochs", type=float, default=DEFAULTS.warmup_epochs)
    p.add_argument("--control-epoch", type=int, default=DEFAULTS.control_epoch,
                   help="batch-size control: the epoch from which B* doubles")
    p.add_argument("--label-smoothing", type=float, default=DEFAULTS.label_smoothing)
    p.add_argument("--label-noise", type=float, default=DEFAULTS.label_noise,
                   help="the fraction of training labels flipped in the data of parts 1-4")
    p.add_argument("--ls-label-noise", type=float, default=DEFAULTS.ls_label_noise,
                   help="part 5: the fraction of training labels flipped")
    p.add_argument("--ls-train-per-class", type=int, default=DEFAULTS.ls_train_per_class,
                   help="part 5: training images per class")
    p.add_argument("--ls-lr", type=float, default=DEFAULTS.ls_lr, help=f"part 5: the reference rate, per {N} images")
    p.add_argument("--ls-seeds", type=numbers(int), default=DEFAULTS.ls_seeds,
                   help="part 5: of the label-smoothing rows, comma-separated")
    p.add_argument("--protocol-b-star", type=int, default=DEFAULTS.protocol_b_star,
                   help="part 6: its rows train at 2, 4 and 8 times this global batch")
    p.add_argument("--protocol-lars-rates", type=numbers(float), default=DEFAULTS.protocol_lars_rates,
                   help=f"part 6: the LARS rates per {N} tuned at each batch, comma-separated")
    p.add_argument("--protocol-sgd-rates", type=numbers(float), default=DEFAULTS.protocol_sgd_rates,
                   help=f"part 6: the SGD rates per {N} tuned at each batch, comma-separated")
    p.add_argument("--tuning-seed", type=int, default=DEFAULTS.tuning_seed,
                   help="part 6: the seed its rates are tuned on (not one of --seeds: it is not reported)")
    p.add_argument("--model", default=DEFAULTS.model)
    p.add_argument("--image-size", type=int, default=DEFAULTS.image_size)
    p.add_argument("--difficulty", choices=sorted(DIFFICULTIES), default=DEFAULTS.difficulty)
    p.add_argument("--train-per-class", type=int, default=DEFAULTS.train_per_class)
    p.add_argument("--val-per-class", type=int, default=DEFAULTS.val_per_class)
    p.add_argument("--workers", type=int, default=DEFAULTS.workers, help="data loader processes")
    p.add_argument("--store", help="a JSON-lines file of finished runs, looked up before training a run and appended "
                                   "to after (commit it to keep runs across machines)")
    p.add_argument("--kernels", type=numbers(str), metavar="CORETYPES",
                   help="OpenBLAS core types (OPENBLAS_CORETYPE, e.g. Haswell,SkylakeX): one computes this study "
                        "with it; several run part 1 under each in turn, into OUTPUT/kernels/TYPE, and compare "
                        "them (with --store and --parts 1)")
    return p.parse_args(argv)


def design_of(args):
    design = Design(**{field.name: getattr(args, field.name) for field in dataclasses.fields(Design)})
    check(design, args.lr_sweep, args.parts)
    return design


def check(design, sweep_rates=None, parts=DEFAULT_PARTS):
    """The study's own constraints (the engine checks the rest of each run's configuration)."""
    if not set(parts) <= set(PARTS):
        raise UserError(f"--parts {','.join(map(str, parts))}: the study's parts are 1 to {PARTS[-1]}")
    for flag in ("epochs", "image_size", "train_per_class", "val_per_class", "ls_train_per_class"):
        if getattr(design, flag) <= 0:
            raise UserError(f"--{flag.replace('_', '-')} must be a positive integer, got {getattr(design, flag)}")
    if design.model not in MODELS:
        raise UserError(f"unknown --model {design.model!r}: choose one of {', '.join(MODELS)}")
    for flag in ("label_noise", "ls_label_noise"):
        if not 0 <= getattr(design, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} {getattr(design, flag):g} is not a fraction in [0, 1)")
    rates = [("--lr", design.lr), ("--lars-lr", design.lars_lr), ("--ls-lr", design.ls_lr)]
    for flag, rate in rates + [(flag, rate) for flag, listed in (("--lr-sweep", sweep_rates or ()),
                                                                  ("--protocol-lars-rates", design.protocol_lars_rates),
                                                                  ("--protocol-sgd-rates", design.protocol_sgd_rates))
                               for rate in listed]:
        if not rate > 0:  # nan included
            raise UserError(f"{flag} must be positive, got {rate:g}")
    if design.epochs < 2:
        raise UserError(f"--epochs {design.epochs}: the study needs at least 2 (batch-size control doubles the "
                        "batch part-way)")
    if not 0 <= design.warmup_epochs < design.epochs:
        raise UserError(f"--warmup-epochs {design.warmup_epochs:g} must be at least 0 and less than --epochs "
                        f"{design.epochs}")
    for flag, seeds in (("--seeds", design.seeds), ("--batch-seeds", design.batch_seeds),
                        ("--ls-seeds", design.ls_seeds)):
        if len(set(seeds)) != len(seeds):
            raise UserError(f"{flag} {','.join(map(str, seeds))} repeats a seed: list each once")
        if len(seeds) < 2 and not (sweep_rates and flag == "--seeds"):
            raise UserError(f"{flag} {seeds[0]}: the study needs at least two seeds per row (B* compares "
                            "means within one standard deviation); one is enough for --lr-sweep")
    batch = N
    while batch < design.max_batch:
        batch *= 2
    if design.max_batch < 2 * N or batch != design.max_batch:
        raise UserError(f"--max-batch {design.max_batch} is not {N} times a power of two (at least {2 * N}): "
                        f"use e.g. {batch}")
    if design.micro_batch <= 0 or design.micro_batch % N:
        raise UserError(f"--micro-batch {design.micro_batch} is not a positive multiple of {N}: use e.g. 512")
    if not 0 < design.control_epoch < design.epochs:
        raise UserError(f"--control-epoch {design.control_epoch} is not inside the {design.epochs} epochs: "
                        f"choose 1 to {design.epochs - 1}")
    largest = LARS_MULTIPLES[-1] * design.max_batch
    if design.train_size < largest:
        raise UserError(f"{design.train_size} training images hold less than one batch of {LARS_MULTIPLES[-1]} × "
                        f"--max-batch = {largest} (the largest LARS row): raise --train-per-class or lower --max-batch")
    if design.noisy().train_size < 2 * design.max_batch:
        raise UserError(f"{design.noisy().train_size} training images of part 5 hold less than one batch of 2 × "
                        f"--max-batch = {2 * design.max_batch}: raise --ls-train-per-class or lower --max-batch")
    if 6 in parts:
        check_protocol(design)
    for row_design, row in reachable_rows(design, parts):  # the engine's checks now, not hours into the study
        config_for(row, 0, row_design, ".", ".").resolved()


def check_protocol(design):
    """Part 6's own constraints."""
    batch = design.protocol_b_star
    if batch < N or batch % N or (batch // N) & (batch // N - 1):
        raise UserError(f"--protocol-b-star {design.protocol_b_star} is not {N} times a power of two: use e.g. 128")
    largest = LARS_MULTIPLES[-1] * design.protocol_b_star
    if design.train_size < largest:
        raise UserError(f"{design.train_size} training images hold less than one batch of {LARS_MULTIPLES[-1]} × "
                        f"--protocol-b-star = {largest}: raise --train-per-class or lower --protocol-b-star")
    for flag, rates in (("--protocol-lars-rates", design.protocol_lars_rates),
                        ("--protocol-sgd-rates", design.protocol_sgd_rates)):
        if len(set(rates)) != len(rates):
            raise UserError(f"{flag} {','.join(f'{rate:g}' for rate in rates)} repeats a rate: list each once")
    if design.tuning_seed in design.seeds:
        raise UserError(f"--tuning-seed {design.tuning_seed} is one of --seeds: the tuning seed is not reported, "
                        "choose another (e.g. 100)")


def reachable_rows(design, parts=DEFAULT_PARTS):
    """Every (design, row) the study can train, whichever batch B* turns out to be."""
    batches = [row.batch for row in batch_rows(design)]
    rows = [row for b in batches for row in warmup_rows(b) + control_rows(b, design) + lars_rows(b)]
    rows += protocol_tuning_rows(design) if 6 in parts else []
    noisy = [row for b in batches for row in smoothing_rows(b, design)]
    return [(design, row) for row in batch_rows(design) + rows] + [(design.noisy(), row) for row in noisy]


def use_device(device, argv):
    """Compute on `device`: nothing to do where the engine chose it; on a GPU machine asked for
    the CPU, start again with MINIDL_DEVICE=cpu (the engine picks its device when imported)."""
    from minidl.backend import on_gpu
    if device is None or (device == "gpu") == on_gpu:
        return
    if device == "gpu":
        raise UserError("--device gpu, but this process computes on the CPU (CuPy sees no usable GPU, or "
                        "MINIDL_DEVICE=cpu is set): run on a machine with a GPU and CuPy, without MINIDL_DEVICE=cpu")
    os.execve(sys.executable, [sys.executable, "-m", "minidl.experiments.large_batch", *argv],
              dict(os.environ, MINIDL_DEVICE="cpu"))


# OpenBLAS core types whose kernels use AVX-512: OpenBLAS takes them on any x86 CPU, which then stops
# on an illegal instruction at the first product
AVX512_CORE_TYPES = {"skylakex", "cooperlake", "sapphirerapids"}


def check_kernels(args):
    for kernel in args.kernels or ():
        if not kernel.isalnum():
            raise UserError(f"--kernels {kernel!r} is not an OpenBLAS core type name: use e.g. Haswell,SkylakeX")
    if args.kernels and len(set(args.kernels)) != len(args.kernels):
        raise UserError(f"--kernels {','.join(args.kernels)} repeats a core type: list each once")
    if args.kernels and len(args.kernels) > 1:
        if args.store is None:
            raise UserError("--kernels with several core types compares them from the run store: add --store FILE")
        if set(args.parts) != {1} or args.lr_sweep:
            raise UserError("--kernels with several core types runs part 1 only: add --parts 1 (and no --lr-sweep)")
    flags = cpu_flags()
    for kernel in args.kernels or ():
        if kernel.lower() in AVX512_CORE_TYPES and flags and "avx512f" not in flags:
            raise UserError(f"--kernels {kernel}: its kernels need AVX-512, which this CPU lacks: use a core type "
                            "it runs (e.g. Haswell), or a machine with AVX-512")


def use_kernel(kernel, argv):
    """Compute with OpenBLAS's kernels for the core type `kernel` (None: the one it picks). The core type
    is read when NumPy loads, so a process started without it starts again with OPENBLAS_CORETYPE set."""
    from minidl.experiments.large_batch.store import blas_kernel
    if kernel is None:
        return
    if os.environ.get("OPENBLAS_CORETYPE") != kernel:
        os.execve(sys.executable, [sys.executable, "-m", "minidl.experiments.large_batch", *argv],
                  dict(os.environ, OPENBLAS_CORETYPE=kernel))
    chosen = blas_kernel().split()[-1]
    if chosen.lower() != kernel.lower():
        raise UserError(f"--kernels {kernel}: OpenBLAS computes with {chosen} kernels instead (a core type it does "
                        "not know, or one this CPU cannot run): use e.g. Haswell")


def part1_per_kernel(kernels, argv, design, output_dir, store):
    """Part 1 under each kernel in turn, each in a process of its own (the core type is fixed when NumPy
    loads) writing to OUTPUT/kernels/TYPE and the store; then the comparison, from the store."""
    from minidl.experiments.large_batch.spread import compare_kernels
    from minidl.experiments.large_batch.store import Store
    for kernel in kernels:
        child = subprocess.run([sys.executable, "-m", "minidl.experiments.large_batch", *argv, "--kernels", kernel,
                                "--output-dir", str(output_dir / "kernels" / kernel)])
        if child.returncode:
            return child.returncode
    text, paths = compare_kernels(design, Store(store.path).records, output_dir)
    print(text + "".join(f"{path}\n" for path in paths), end="")
    return 0


def main(argv=None):
    """The study's command line; returns its exit code."""
    return run_command(PROG, f"{__name__}:study_command", sys.argv[1:] if argv is None else argv)


def study_command(argv):
    from minidl.experiments.large_batch import study
    from minidl.experiments.large_batch.runs import Interrupted
    from minidl.experiments.large_batch.store import Store
    try:
        args = parse_args(argv)
        design = design_of(args)
        if args.tune_batch < N or args.tune_batch & (args.tune_batch - 1) or args.tune_batch > design.train_size:
            raise UserError(f"--tune-batch {args.tune_batch} is not {N}·2^j within the {design.train_size} training "
                            f"images: use e.g. {2 * N}")
        check_kernels(args)
        if args.list and (set(args.parts) - {1, 6} or args.lr_sweep or (args.kernels and len(args.kernels) > 1)):
            raise UserError("--list lists parts 1 and 6 of one kernel (the rows of parts 2-5 follow part 1's B*): "
                            "use it with --parts 6, at most one --kernels and no --lr-sweep")
        use_device(args.device, argv)
        output_dir, cache_dir = (writable(flag, path, folder=True) for flag, path in
                                  (("--output-dir", args.output_dir), ("--cache-dir", args.cache_dir)))
        store = Store(writable("--store", args.store)) if args.store else None
        if args.kernels and len(args.kernels) > 1:
            return part1_per_kernel(args.kernels, argv, design, output_dir, store)
        use_kernel(args.kernels[0] if args.kernels else None, argv)
        if args.list:
            print(listing(design, args.parts, output_dir, cache_dir, store), end="")
            return 0
        if args.lr_sweep:
            text, best = study.lr_sweep(design, args.lr_sweep, output_dir, cache_dir, args.tune, args.tune_batch,
                                        store)
            flag = "--" + study.TUNED[args.tune].replace("_", "-")
            print(text + f"lowest error at η = {best:g} per {N}: run the study with {flag} {best:g}")
            return 0
        done = study.run_study(design, output_dir, cache_dir, tuple(sorted({1, *args.parts})), store)
        paths = study.write_outputs(done, output_dir)
        print(study.markdown(done))
        print("\n".join(map(str, paths)))
        return 0
    except (Interrupted, KeyboardInterrupt) as error:
        print(f"{PROG}: interrupted ({error or 'Ctrl-C'}): run the same command again to resume", file=sys.stderr)
        return 130
