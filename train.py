"""Train a ResNet with minidl.

    python train.py                                   # the embedded default: resnet20, minutes on a CPU
    python train.py --data-path /data/imagenet --model resnet50 -b 32 --epochs 90

Flags follow torchvision's reference trainer where it has one. With no --data-path the run
uses the embedded dataset (generated once into the cache) and a CIFAR-style profile; with one,
ImageNet's profile. Any flag given explicitly overrides the profile.
"""
import argparse
import sys


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show a flag's default unless it is None (a profile's default, explained in its help)."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (not usage + message), still exit code 2."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def steps(text):
    try:
        return tuple(int(step) for step in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of epochs, e.g. 30,60,80")


def profile_default(field):
    from minidl.config import EMBEDDED_PROFILE, IMAGENET_PROFILE
    return f"default: {EMBEDDED_PROFILE[field]} on the embedded dataset, {IMAGENET_PROFILE[field]} with --data-path"


def parse_args(argv=None):
    from minidl.config import Config
    d = Config()
    p = OneLineErrorParser(prog="train.py", description=__doc__.split("\n\n")[0],
                           formatter_class=HelpFormatter)
    p.add_argument("--data-path", default=None, help="ImageNet-layout folder with train/<class>/ and val/<class>/ "
                   "(default: the embedded dataset)")
    p.add_argument("--model", default=None, help=profile_default("model"))
    p.add_argument("-b", "--batch-size", type=int, default=None, help="images per process; " + profile_default("batch_size"))
    p.add_argument("--epochs", type=int, default=None, help=profile_default("epochs"))
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate")
    p.add_argument("--momentum", type=float, default=d.momentum, help="SGD momentum")
    p.add_argument("--wd", "--weight-decay", dest="weight_decay", type=float, default=None,
                   help=profile_default("weight_decay"))
    p.add_argument("--norm-weight-decay", type=float, default=None,
                   help="weight decay of BN parameters and biases (default: the same as --wd)")
    p.add_argument("--nesterov", action="store_true", help="Nesterov momentum")
    p.add_argument("--label-smoothing", type=float, default=d.label_smoothing, help="ε of torch's label smoothing")
    p.add_argument("--lr-scheduler", default=d.lr_scheduler, help="cosine, step or constant")
    p.add_argument("--lr-steps", type=steps, default=d.lr_steps, help="epochs where the step scheduler decays")
    p.add_argument("--lr-gamma", type=float, default=d.lr_gamma, help="decay factor of the step scheduler")
    p.add_argument("--train-crop-size", type=int, default=None, help=profile_default("train_crop_size"))
    p.add_argument("--val-crop-size", type=int, default=None, help=profile_default("val_crop_size"))
    p.add_argument("--val-resize-size", type=int, default=None, help=profile_default("val_resize_size"))
    p.add_argument("--augment", default=None, help="imagenet (random-resized-crop + flip), cifar (pad 4, "
                   "random crop, flip) or none; " + profile_default("augment"))
    p.add_argument("--output-dir", default=d.output_dir, help="where metrics.jsonl and summary.json go")
    p.add_argument("--cache-dir", default=d.cache_dir, help="where the embedded dataset is generated "
                   "($MINIDL_CACHE overrides the default)")
    p.add_argument("--seed", type=int, default=d.seed, help="drives initialization, data order and augmentation")
    p.add_argument("--print-freq", type=int, default=d.print_freq, help="iterations between progress updates")
    p.add_argument("-j", "--workers", type=int, default=d.workers,
                   help="data loading processes (0: load in the training process)")
    return Config(**vars(p.parse_args(argv)))


def main(argv=None):
    from minidl.errors import UserError
    try:  # imports inside: choosing the device (MINIDL_DEVICE) can itself be a user error
        config = parse_args(argv)
        from minidl.trainer import run
        run(config)
    except UserError as error:
        sys.stderr.write(f"train.py: error: {error}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("train.py: interrupted\n")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
