"""How long would a training run take at scale? `python -m minidl.plan` (`minidl-plan`) simulates it.

    python -m minidl.plan --recipe sony --world-size 2176 --machine abci

prints the time per iteration and its parts, per epoch and to train, images/s and the scaling
efficiency, for the ring, hierarchical and 2D-torus all-reduce side by side; `--json PATH` writes
every figure, `--plot DIR` draws efficiency against GPUs and one iteration's timeline.

Details: docs/plan.md.
"""
import sys

from minidl.cli import OneLineErrorParser, run_command

SHARED = ("recipe", "model", "batch_size", "batch_schedule", "max_per_rank_batch", "epochs", "train_crop_size",
          "allreduce", "torus_shape", "bucket_mb")  # minidl.config's settings a plan takes, as training does
IMAGENET_TRAIN_IMAGES = 1_281_167


def build_parser(prog):
    from minidl.config import SETTINGS
    from minidl.plan import machines
    from minidl.train import add_settings
    parser = OneLineErrorParser(prog=prog, description=__doc__.split("\n\n")[0] + " All three all-reduce "
                                "algorithms are simulated side by side; --allreduce picks the one --plot draws.")
    add_settings(parser, [s for s in SETTINGS if s.name in SHARED])
    plan = parser.add_argument_group("the plan")
    plan.add_argument("--world-size", type=int, required=True, help="GPUs (ranks) of the run")
    plan.add_argument("--machine", default="abci", help=f"{', '.join(machines.names())}, or a machine file "
                      "NAME.json (default: abci)")
    plan.add_argument("--dataset-size", type=int, default=IMAGENET_TRAIN_IMAGES,
                      help=f"training images (default: ImageNet's {IMAGENET_TRAIN_IMAGES:,})")
    plan.add_argument("--calibrate", metavar="BENCH_JSON", help="this machine's links instead, fitted to a "
                      "`python -m minidl.bench allreduce --json` file (one node of its ranks); give the compute too")
    speed = parser.add_argument_group("one GPU's compute, instead of the machine's figure")
    speed.add_argument("--images-per-second", type=float, help="of a whole training iteration, per GPU")
    speed.add_argument("--forward-ms", type=float, help="per iteration at the first epoch's per-GPU micro-batch")
    speed.add_argument("--backward-ms", type=float, help="per iteration at the first epoch's per-GPU micro-batch")
    speed.add_argument("--update-ms", type=float, help="the optimizer's update (default: the flat buffers streamed "
                       "once through the GPU's memory)")
    speed.add_argument("--loader-images-per-second", type=float, help="the input pipeline's rate per GPU "
                       "(default: never waited for)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", metavar="PATH", help="write every figure of the plan to this JSON file")
    out.add_argument("--plot", metavar="DIR", help="draw efficiency.png and timeline.png into this folder (and "
                     "print the scaling efficiency of one iteration on 1 GPU, 1 node, 2 nodes, 4, ... up to the run's)")
    return parser


def main(argv=None, prog="minidl-plan"):
    return run_command(prog, "minidl.plan.__main__:plan", argv, prog)


def plan(argv, prog):
    """The command line's work; user errors go to run_command's handler."""
    from minidl.fileio import writable, write_json_atomic
    from minidl.distributed.p2p import native_of
    from minidl.plan import report, run
    args = build_parser(prog).parse_args(argv)
    json_path = writable("--json", args.json) if args.json else None
    plot_dir = writable("--plot", args.plot, folder=True) if args.plot else None
    config, rows, setup = prepare(args)
    runs = run.simulate_run(setup, rows)
    about = header(args, config, setup, runs)
    print(report.text(about, runs))
    # a p2p all-reduce runs the stages of its native one, and the model prices them alike
    chosen = next(r for r in runs if r.algorithm.label.split()[0] == native_of(config.allreduce))
    first = (rows[0]["per_rank_batch"], rows[0]["accum_steps"])
    if json_path:
        write_json_atomic(json_path, {"about": about, "world_size": setup.world_size, "model": setup.model,
                                      "image_size": setup.image_size, "dataset_size": args.dataset_size,
                                      "machine": machine_dict(setup.machine),
                                      "runs": [report.run_dict(r) for r in runs],
                                      "timeline": {"algorithm": chosen.algorithm.label,
                                                   **report.timeline_dict(chosen.iterations[first])}})
        print(f"minidl-plan: every figure in {json_path}")
    if plot_dir:
        from minidl.plan import plots  # matplotlib only where it draws
        title = f"{setup.model} on {setup.machine.name}, {first[0]} images per GPU"
        curve = run.efficiency_curve(setup, *first)
        print(report.curve_text(curve, first[0]))
        written = [plots.save(plots.efficiency_figure(curve, title), plot_dir / "efficiency.png"),
                   plots.save(plots.timeline_figure(chosen.iterations[first], f"{title}, {setup.world_size} GPUs, "
                                                    f"{chosen.algorithm.label}"), plot_dir / "timeline.png")]
        print("minidl-plan: drew " + ", ".join(map(str, written)))
    return 0


def prepare(args):
    """(the resolved training configuration, its epochs' batch layouts, the run.Setup)."""
    from minidl.bench.allreduce import read_results
    from minidl.config import Config
    from minidl.distributed import parse_shape
    from minidl.errors import UserError
    from minidl.plan import machines, run
    from minidl.training.build import schedule_rows
    for flag in ("world_size", "dataset_size", "images_per_second", "forward_ms", "backward_ms", "update_ms",
                 "loader_images_per_second"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            raise UserError(f"--{flag.replace('_', '-')} must be positive, got {value}")
    config = Config(**{name: getattr(args, name) for name in SHARED}).resolved(imagenet=True)
    rows = schedule_rows(config, args.world_size, args.dataset_size)
    if not all(row["iterations"] for row in rows):
        batch = max(row["global_batch"] for row in rows)
        raise UserError(f"a global batch of {batch:,} is larger than an epoch's {args.dataset_size:,} images: "
                        "use a smaller batch or a larger --dataset-size")
    machine = machines.load(args.machine)
    if args.calibrate:
        _, links = read_results(args.calibrate)
        machine = machines.calibrated(machine, links, f"fitted to {args.calibrate} (costmodel.calibrate)")
    machine = with_compute(machine, args, config, rows[0]["per_rank_batch"] // rows[0]["accum_steps"])
    shape = parse_shape(config.torus_shape) if config.torus_shape else None
    setup = run.Setup(config.model, config.train_crop_size, machine, args.world_size, config.bucket_mb, shape,
                      args.update_ms / 1e3 if args.update_ms else None, args.loader_images_per_second)
    return config, rows, setup.check()


def with_compute(machine, args, config, micro_batch):
    """`machine` with the compute the flags give, where they give one."""
    import dataclasses

    from minidl.errors import UserError
    from minidl.plan.machines import Compute
    timed = (args.forward_ms, args.backward_ms)
    if args.images_per_second and any(timed):
        raise UserError("give one GPU's speed once: --images-per-second, or --forward-ms with --backward-ms")
    if any(timed) and not all(timed):
        raise UserError("--forward-ms and --backward-ms go together: give both, measured at the first epoch's "
                        f"per-GPU micro-batch ({micro_batch} images)")
    if args.calibrate and not (args.images_per_second or all(timed)):
        raise UserError("--calibrate describes this machine's links, not its compute: give --images-per-second, "
                        "or --forward-ms and --backward-ms, measured on it")
    common = dict(model=config.model, image_size=config.train_crop_size)
    if args.images_per_second:
        compute = Compute(**common, batch=micro_batch, images_per_second=args.images_per_second,
                          source="--images-per-second")
    elif all(timed):
        compute = Compute(**common, batch=micro_batch, forward_ms=args.forward_ms, backward_ms=args.backward_ms,
                          source="--forward-ms and --backward-ms")
    else:
        return machine
    return dataclasses.replace(machine, compute=compute, sources={**machine.sources, "compute": compute.source})


def header(args, config, setup, runs):
    """The plan's first lines: what runs where, on which figures."""
    from minidl.plan.profile import profile
    from minidl.plan.run import per_image_seconds
    machine, compute = setup.machine, setup.machine.compute
    recipe = f"recipe {config.recipe}" if config.recipe else (
        f"batch schedule {config.batch_schedule}" if config.batch_schedule else f"{config.batch_size} images per GPU")
    forward, backward = per_image_seconds(setup)
    rate = (f"{compute.images_per_second:,.0f} img/s" if compute.images_per_second else
            f"backward {compute.backward_ms:g} ms" + (f", forward {compute.forward_ms:g} ms" if compute.forward_ms
                                                       else ""))
    buckets = runs[0].algorithm.exchange.buckets
    nbytes = 4 * profile(setup.model, setup.image_size).num_parameters
    torus = next((r.algorithm.grid for r in runs if r.algorithm.grid), None)
    lines = [f"minidl plan: {setup.model} at {setup.image_size} px on {setup.world_size:,} GPUs of {machine.name} "
             f"({setup.nodes:,} node{'s' * (setup.nodes > 1)} of {machine.gpus_per_node}), {recipe}: "
             f"{config.epochs} epochs of {args.dataset_size:,} images",
             f"  one GPU: {rate} on {compute.model} at {compute.image_size} px, batch {compute.batch}: forward "
             f"{forward * 1e3:.3g} + backward {backward * 1e3:.3g} ms per image here (source: {compute.source})",
             f"  links: {machine.intra_node_bandwidth / 1e9:g} GB/s and {machine.intra_node_latency * 1e6:g} us "
             f"between GPUs of a node; {machine.network_adapters_per_node} x "
             f"{machine.network_adapter_bandwidth * 8 / 1e9:g} Gbit/s and {machine.network_latency * 1e6:g} us per "
             f"node on the network; memory {machine.memory_bandwidth / 1e9:g} GB/s",
             f"  gradient: {nbytes / 1e6:.1f} MB in {len(buckets)} bucket{'s' * (len(buckets) > 1)} "
             f"(--bucket-mb {config.bucket_mb:g})"]
    if torus is not None and setup.world_size > 1:
        how = "the cost model's fastest on these links" if torus.source == "cost model" else "from --torus-shape"
        lines[-1] += f"; torus2d grid {torus.shape[0]}x{torus.shape[1]} ({how})"
    return lines


def machine_dict(machine):
    from dataclasses import asdict
    return {**{k: v for k, v in asdict(machine).items() if k not in ("compute", "sources")},
            "compute": asdict(machine.compute), "sources": machine.sources}


if __name__ == "__main__":
    sys.exit(main(prog="python -m minidl.plan"))
