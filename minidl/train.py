"""Train a ResNet with minidl: the command line (`minidl-train`, `python -m minidl.train`,
`python train.py`).

Every flag is declared once, in minidl.config.SETTINGS; one left out comes from --recipe, else
the dataset profile, else the base default. `minidl-train` alone trains resnet20 on the
embedded dataset, minutes on a CPU; `mpiexec -n 8 minidl-train ...` trains on 8 ranks.

Details: docs/training.md, "minidl/train.py".
"""
import argparse
import json
import sys


def argument_type(parse):
    """A setting's parser as an argparse type: its ValueError message becomes argparse's."""
    def convert(text):
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def default_text(setting):
    """Where an unset flag's value comes from, for --help."""
    from minidl.config import UNSET
    if setting.embedded is not UNSET:
        return f"{setting.embedded} on the embedded dataset, {setting.imagenet} with --data-path"
    if setting.base is not UNSET:
        return str(setting.base)
    if setting.note:
        return setting.note
    return "%(default)s"


def add_settings(parser, settings):
    """Add each of `settings` (minidl.config.Setting) to `parser` in its group; {group name: group}."""
    groups = {}
    for setting in settings:
        group = groups.get(setting.group) or groups.setdefault(setting.group, parser.add_argument_group(setting.group))
        options = dict(dest=setting.name, default=None, help=f"{setting.help} (default: {default_text(setting)})".lstrip())
        if setting.action:
            options.update(action=setting.action, default=setting.default)
            if setting.const is not None:
                options["const"] = setting.const
        else:
            custom = setting.type not in (None, int, float, str)  # argparse words the builtin types' errors well
            options.update(type=argument_type(setting.type) if custom else setting.type, choices=setting.choices)
            if setting.default is not None or setting.default_factory is not None:
                options["default"] = setting.default_factory() if setting.default_factory else setting.default
        group.add_argument(*setting.flags, **options)
    return groups


def build_parser(prog="minidl-train"):
    from minidl.cli import OneLineErrorParser
    from minidl.config import SCHEDULE, SETTINGS
    parser = OneLineErrorParser(prog=prog, description=__doc__.split("\n\n")[0])
    groups = add_settings(parser, SETTINGS)
    schedule = groups[SCHEDULE]
    schedule.add_argument("--print-schedule", action="store_true", help="print each epoch's global batch, per-rank "
                          "batch, accumulation steps and lr as JSON, and exit")
    schedule.add_argument("--world-size", type=int, help="with --print-schedule: pretend this many processes "
                          "(default: the real number)")
    schedule.add_argument("--dataset-size", type=int, help="with --print-schedule: pretend this many training images "
                          "(default: the real number)")
    return parser


def print_schedule(config, world_size, dataset_size):
    from minidl.training.build import schedule_rows
    config = config.resolved()
    for row in schedule_rows(config, world_size or 1, dataset_size):
        print(json.dumps(row))


def main(argv=None, prog="minidl-train"):
    from minidl.cli import run_command
    return run_command(prog, "minidl.train:train", argv, prog)


def train(argv, prog):
    """The command line's work; user errors go to run_command's handler."""
    from minidl.config import Config
    args = vars(build_parser(prog).parse_args(argv))
    schedule_only, world_size, dataset_size = (args.pop(k) for k in ("print_schedule", "world_size", "dataset_size"))
    config = Config(**args)
    if schedule_only:
        print_schedule(config, world_size, dataset_size)
        return 0
    from minidl.trainer import TrainingStopped, run
    try:
        run(config)
    except TrainingStopped as stopped:  # every rank agreed to stop: a clean exit everywhere
        sys.stderr.write(f"{prog}: {stopped}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m minidl.train"))
