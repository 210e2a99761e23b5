"""Train a ResNet with minidl.

    python train.py                                   # the embedded default: resnet20, minutes on a CPU
    python train.py --data-path /data/imagenet --recipe goyal
    python train.py --recipe goyal --print-schedule --world-size 256 --dataset-size 1281167

Flags follow torchvision's reference trainer where it has one. A flag left out takes its value
from --recipe if one is given, else from the dataset profile (the embedded dataset without
--data-path, ImageNet's with it), else the base default; any flag given explicitly wins.
"""
import argparse
import json
import sys


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (not usage + message), still exit code 2."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def int_list(text):
    try:
        return tuple(int(item) for item in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of epochs, e.g. 30,60,80")


def layered_default(field):
    """Where an unset flag's value comes from, for --help."""
    from minidl.config import BASE_DEFAULTS, EMBEDDED_PROFILE, IMAGENET_PROFILE
    if field in EMBEDDED_PROFILE:
        return f"{EMBEDDED_PROFILE[field]} on the embedded dataset, {IMAGENET_PROFILE[field]} with --data-path"
    return str(BASE_DEFAULTS.get(field))


def build_parser():
    from minidl.config import OPTIMIZERS, RECIPES, Config
    from minidl.data import TRAIN_TRANSFORMS
    from minidl.dist import ALGORITHMS, BACKENDS
    from minidl.optim import SGD
    from minidl.schedule import LR_SCHEDULERS, WARMUP_METHODS
    d = Config()
    p = OneLineErrorParser(prog="train.py", description=__doc__.split("\n\n")[0])

    def flag(*names, field=None, **kwargs):
        field = field or names[-1].lstrip("-").replace("-", "_")
        kwargs.setdefault("default", None)
        note = kwargs.pop("note", None) or (f"default: {layered_default(field)}" if kwargs["default"] is None
                                            else "default: %(default)s")
        kwargs["help"] = f"{kwargs.get('help', '')} ({note})".lstrip()
        group.add_argument(*names, dest=field, **kwargs)

    group = p.add_argument_group("data and model")
    flag("--data-path", help="ImageNet-layout folder with train/<class>/ and val/<class>/",
         note="default: the embedded dataset")
    flag("--model", help="resnet18/34/50/101/152 or resnet20/32/56")
    flag("--augment", choices=TRAIN_TRANSFORMS, help="imagenet: random-resized-crop + flip; cifar: pad 4, "
         "random crop, flip; none: resize + center crop")
    flag("--train-crop-size", type=int)
    flag("--val-crop-size", type=int)
    flag("--val-resize-size", type=int)
    flag("-j", "--workers", type=int, default=d.workers, help="data loading processes (0: in the training process)")
    flag("--zero-init-residual", action="store_const", const=True, help="γ = 0 in the last BN of every block")
    flag("--bn-group-size", type=int, help="BN statistics over groups of this many images per process (ghost BN)",
         note="default: the whole micro-batch")

    group = p.add_argument_group("batch and recipe")
    flag("--recipe", choices=tuple(RECIPES), help="fill unset flags from a paper's recipe", note="default: none")
    flag("-b", "--batch-size", type=int, help="images per process and step")
    flag("--batch-schedule", help="GLOBAL batch from each epoch on, e.g. 0:8192,30:16384 (batch-size control)",
         note="default: -b times the number of processes")
    flag("--max-per-rank-batch", type=int, help="largest micro-batch per process; above it gradients accumulate",
         note="default: no limit")
    flag("--epochs", type=int)

    group = p.add_argument_group("optimizer")
    flag("--opt", choices=OPTIMIZERS, help="SGD with momentum, or LARS")
    flag("--lr", type=float, help="reference learning rate for --lr-base-batch images (linear scaling rule)")
    flag("--lr-base-batch", type=int, help="the global batch the reference rate is for")
    flag("--momentum", type=float)
    flag("--nesterov", action="store_true", default=False, help="Nesterov momentum")
    flag("--sgd-form", choices=SGD.FORMS, help="pytorch: u ← m·u + g, w ← w − η·u; caffe2: v ← m·v + η·g, "
         "w ← w − v (Goyal et al., eqs. 9 and 10)")
    flag("--no-momentum-correction", field="momentum_correction", action="store_false", default=True,
         help="with the rate inside the momentum (caffe2, LARS), do not rescale it when the rate changes",
         note="default: corrected")
    flag("--wd", "--weight-decay", field="weight_decay", type=float)
    flag("--norm-weight-decay", type=float, help="weight decay of BN parameters and biases",
         note="default: the same as --wd")
    flag("--lars-eta", type=float, help="LARS trust coefficient")
    flag("--label-smoothing", type=float, help="ε of torch's label smoothing")

    group = p.add_argument_group("learning-rate schedule")
    flag("--lr-scheduler", choices=LR_SCHEDULERS, help="decay after warmup")
    flag("--lr-steps", type=int_list, help="epochs where the step scheduler multiplies by --lr-gamma")
    flag("--lr-gamma", type=float)
    flag("--lr-power", type=float, help="exponent of the poly scheduler")
    flag("--lr-warmup-epochs", type=float)
    flag("--lr-warmup-method", choices=WARMUP_METHODS, help="linear: gradual per iteration; constant: hold the start")
    flag("--lr-warmup-start", type=float, help="rate at the first iteration", note="default: the reference --lr")
    flag("--print-schedule", action="store_true", default=False,
         help="print each epoch's global batch, per-rank batch, accumulation steps and lr as JSON, and exit")
    flag("--world-size", type=int, help="with --print-schedule: pretend this many processes",
         note="default: the real number")
    flag("--dataset-size", type=int, help="with --print-schedule: pretend this many training images",
         note="default: the real number")

    group = p.add_argument_group("distributed (launch with mpiexec -n N python -m mpi4py train.py ...)")
    flag("--allreduce", choices=ALGORITHMS, default=d.allreduce, help="how ranks sum their gradients")
    flag("--torus-shape", help="XxY grid of ranks for torus2d", note="default: the squarest grid")
    flag("--bucket-mb", type=float, default=d.bucket_mb,
         help="gradient buckets reduced during backward (0: one, after backward)")
    flag("--dist-backend", choices=BACKENDS, help="transport of the collectives",
         note="default: nccl on GPUs, mpi otherwise")

    group = p.add_argument_group("checkpoints")
    flag("--resume", help="a checkpoint to continue from, or auto: the newest in --output-dir",
         note="default: start afresh")
    flag("--checkpoint-every", type=int, default=d.checkpoint_every,
         help="iterations between checkpoints, besides the one at each epoch's end (0: only those)")
    flag("--keep-checkpoints", type=int, default=d.keep_checkpoints, help="how many regular checkpoints to keep")

    group = p.add_argument_group("run")
    flag("--output-dir", default=d.output_dir, help="where config.json, metrics.jsonl and summary.json go")
    flag("--cache-dir", default=d.cache_dir, help="where the embedded dataset is generated ($MINIDL_CACHE)")
    flag("--seed", type=int, default=d.seed, help="drives initialization, data order and augmentation")
    flag("--print-freq", type=int, default=d.print_freq, help="steps between progress-bar updates")

    group = p.add_argument_group("GPU")
    flag("--amp", action="store_true", default=False,
         help="bf16 activations and convolutions, float32 weights, statistics and loss (GPU only)")
    flag("--cuda-graph", action="store_true", default=False,
         help="capture the training step once in a CUDA graph and replay it (GPU, one process, SGD); "
              "the loss is then checked every --print-freq steps")
    return p


def print_schedule(config, world_size, dataset_size):
    from minidl.trainer import schedule_rows
    config = config.resolved()
    for row in schedule_rows(config, world_size or 1, dataset_size):
        print(json.dumps(row))


def main(argv=None):
    from minidl.errors import UserError
    try:  # imports inside: choosing the device (MINIDL_DEVICE) can itself be a user error
        from minidl.config import Config
        args = vars(build_parser().parse_args(argv))
        schedule_only, world_size, dataset_size = (args.pop(k) for k in ("print_schedule", "world_size", "dataset_size"))
        config = Config(**args)
        if schedule_only:
            print_schedule(config, world_size, dataset_size)
            return 0
        from minidl.trainer import TrainingStopped, run
        try:
            run(config)
        except TrainingStopped as stopped:  # every rank agreed to stop: a clean exit everywhere
            sys.stderr.write(f"train.py: {stopped}\n")
            return 1
    except UserError as error:
        sys.stderr.write(f"train.py: error: {error}\n")
        end_other_ranks(2)
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("train.py: interrupted\n")
        return 130
    return 0


def end_other_ranks(code):
    """A mistake found on one rank must end them all: the others may wait in a collective."""
    from minidl.dist import launched_by_mpi
    if launched_by_mpi():
        from mpi4py import MPI
        if MPI.Is_initialized() and MPI.COMM_WORLD.Get_size() > 1:
            from minidl.dist import watcher
            watcher.disarm()  # this rank has said why it ends
            MPI.COMM_WORLD.Abort(code)


if __name__ == "__main__":
    sys.exit(main())
