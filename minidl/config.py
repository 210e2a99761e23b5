"""The training configuration: every setting of a run declared ONCE, in `SETTINGS`.

One `Setting` per field (flags, help, type, defaults, check) gives the `Config` dataclass, the
argparse parser, the validation, the dataset profiles and config.json: adding a setting is
adding one entry. A field left as None comes from the recipe, else the dataset profile, else
the base defaults; explicit values always win. Validation raises UserError naming the fix.

Details: docs/training.md, "minidl/config.py".
"""
import dataclasses
import json
from pathlib import Path

from minidl import environment
from minidl.backend import require_gpu
from minidl.data import TRAIN_TRANSFORMS
from minidl.distributed import ALGORITHMS, BACKENDS, parse_shape
from minidl.errors import UserError
from minidl.models import MODELS
from minidl.optim import SGD
from minidl.schedule import LR_SCHEDULERS, WARMUP_METHODS, BatchSchedule
from minidl.training.trace import parse_steps

OPTIMIZERS = ("sgd", "lars")
UNSET = object()  # a profile or base default that a setting does not have


def int_list(text):
    """'30,60,80' -> (30, 60, 80), for --lr-steps."""
    try:
        return tuple(int(item) for item in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of epochs, e.g. 30,60,80") from None


# ---- checks: (flag, value) -> a message naming the problem, or None --------------------------

def positive_int(flag, value):
    if value is None or value <= 0:
        return f"{flag} must be a positive integer, got {value}"


def positive_int_or_none(flag, value):
    return None if value is None else positive_int(flag, value)


def positive(flag, value):
    if value is not None and not value > 0:
        return f"{flag} must be positive, got {value}"


def non_negative(flag, value):
    if value is not None and not value >= 0:  # NaN fails too
        return f"{flag} must be >= 0, got {value}"


def fraction(flag, value):
    if not 0 <= value < 1:
        return f"{flag} must be in [0, 1), got {value}"


def one_of(options, what=None):
    def check(flag, value):
        if value not in options:
            return f"unknown {what or flag} {value!r}: choose one of {', '.join(map(str, options))}"
    return check


def gpu_only(flag, value):
    if value:
        require_gpu(flag)


def increasing_epochs(flag, value):
    if list(value) != sorted(value) or any(step <= 0 for step in value):
        return f"{flag} must be increasing positive epochs, got {','.join(map(str, value))}"


def gamma(flag, value):
    if not 0 < value <= 1:
        return f"{flag} must be in (0, 1], got {value}"


def torus_shape(flag, value):
    if value is not None:
        parse_shape(value)  # raises its own UserError


def batch_schedule(flag, value):
    if value is not None:
        BatchSchedule.parse(value)  # raises its own UserError


def trace_steps(flag, value):
    if value is not None:
        parse_steps(value)  # raises its own UserError


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    flags: tuple
    help: str
    group: str
    type: object = None
    default: object = None  # the field's own default (None: filled from the layers)
    default_factory: object = None
    base: object = UNSET  # the base layer's value
    embedded: object = UNSET  # the embedded profile's value
    imagenet: object = UNSET  # the ImageNet profile's value
    choices: tuple = None  # argparse's choices (the check follows them)
    action: str = None  # an argparse action; "on_off" gives the flag and its --no- form (minidl.cli)
    const: object = None
    check: object = None
    note: str = None  # how --help describes a default that is not a value

    @property
    def flag(self):
        return self.flags[-1]

    @property
    def optional(self):
        """Whether None is a valid value after resolution (it means something: "none", "auto")."""
        return self.default is None and self.default_factory is None and self.base is UNSET and \
            self.embedded is UNSET

    def problem(self, value):
        if self.check:
            return self.check(self.flag, value)
        if self.choices and not (value is None and self.optional):
            return one_of(self.choices)(self.flag, value)
        return None


SONY_COMMON = dict(lr=0.1, lr_base_batch=256, lr_warmup_epochs=5.0, lr_warmup_method="linear", lr_warmup_start=0.1,
                   lr_scheduler="poly", lr_power=2.0, epochs=90, weight_decay=1e-4, momentum=0.9,
                   norm_weight_decay=0.0, label_smoothing=0.1, zero_init_residual=True)
RECIPES = {
    # Goyal et al. 2017: k workers × 32 images, 0.1 per 256 scaled linearly, 5-epoch gradual
    # warmup from 0.1, ÷10 at epochs 30/60/80 of 90, no weight decay on BN and biases, γ = 0
    # in the last BN of every residual block, Caffe2's update with momentum correction.
    "goyal": dict(model="resnet50", batch_size=32, lr=0.1, lr_base_batch=256, lr_warmup_epochs=5.0,
                  lr_warmup_method="linear", lr_warmup_start=0.1, lr_scheduler="step", lr_steps=(30, 60, 80),
                  lr_gamma=0.1, epochs=90, weight_decay=1e-4, momentum=0.9, norm_weight_decay=0.0,
                  zero_init_residual=True, sgd_form="caffe2", bn_group_size=32),
    # Mikami et al. 2018, the 224-second run: batch-size control from 16 to 32 images per GPU
    # (34,816 -> 69,632 on its 2,176 GPUs), label smoothing 0.1, warmup, no weight decay on BN
    # and biases. The switch epoch, the warmup's length and the polynomial decay are our choices:
    # the paper does not give them.
    "sony": dict(model="resnet50", batch_schedule="0:16/rank,30:32/rank", **SONY_COMMON),
    # Mikami et al., v2: the 122-second run, 16 images per GPU (55,296 on its 3,456 GPUs) from the
    # start, label smoothing 0.1, the same warmup and decay as above (our choices, as there).
    "sony122": dict(model="resnet50", batch_schedule="0:16/rank", **SONY_COMMON),
}

DATA, BATCH, OPTIMIZER, SCHEDULE = "data and model", "batch and recipe", "optimizer", "learning-rate schedule"
DISTRIBUTED = "distributed (launch with mpiexec -n N python -m mpi4py train.py ...)"
CHECKPOINTS, RUN, GPU = "checkpoints", "run", "GPU"

SETTINGS = (
    Setting("data_path", ("--data-path",), "ImageNet-layout folder with train/<class>/ and val/<class>/", DATA,
            note="the embedded dataset"),
    Setting("model", ("--model",), "resnet18/34/50/101/152 or resnet20/32/56", DATA, embedded="resnet20",
            imagenet="resnet50", check=one_of(MODELS, "model")),
    Setting("augment", ("--augment",), "imagenet: random-resized-crop + flip; cifar: pad 4, random crop, flip; "
            "none: resize + center crop", DATA, embedded="cifar", imagenet="imagenet", choices=TRAIN_TRANSFORMS),
    Setting("train_crop_size", ("--train-crop-size",), "", DATA, int, embedded=32, imagenet=224, check=positive_int),
    Setting("val_crop_size", ("--val-crop-size",), "", DATA, int, embedded=32, imagenet=224, check=positive_int),
    Setting("val_resize_size", ("--val-resize-size",), "", DATA, int, embedded=32, imagenet=256, check=positive_int),
    Setting("workers", ("-j", "--workers"), "data loading processes (0: in the training process)", DATA, int,
            default=0, check=non_negative),
    Setting("zero_init_residual", ("--zero-init-residual",), "γ = 0 in the last BN of every block", DATA,
            base=False, action="store_const", const=True),
    Setting("bn_group_size", ("--bn-group-size",), "BN statistics over groups of this many images per process "
            "(ghost BN)", DATA, int, check=positive_int_or_none, note="the whole micro-batch"),
    Setting("fuse", ("--fuse",), "batch norm fused into the convolutions: each convolution also takes its output's "
            "statistics, the next applies BN and ReLU as it reads its input (less memory kept for backward; "
            "--no-fuse: separate ops)", DATA, default=False, action="on_off"),

    Setting("recipe", ("--recipe",), "fill unset flags from a paper's recipe", BATCH, choices=tuple(RECIPES),
            note="none"),
    Setting("batch_size", ("-b", "--batch-size"), "images per process and step", BATCH, int, embedded=128,
            imagenet=32),
    Setting("batch_schedule", ("--batch-schedule",), "GLOBAL batch from each epoch on, e.g. 0:8192,30:16384, or "
            "per rank, e.g. 0:16/rank,30:32/rank (batch-size control)", BATCH, check=batch_schedule,
            note="-b times the number of processes"),
    Setting("max_per_rank_batch", ("--max-per-rank-batch",), "largest micro-batch per process; above it gradients "
            "accumulate", BATCH, int, check=positive_int_or_none, note="no limit"),
    Setting("epochs", ("--epochs",), "", BATCH, int, embedded=10, imagenet=90, check=positive_int),

    Setting("opt", ("--opt",), "SGD with momentum, or LARS", OPTIMIZER, base="sgd", choices=OPTIMIZERS),
    Setting("lr", ("--lr",), "reference learning rate for --lr-base-batch images (linear scaling rule)", OPTIMIZER,
            float, embedded=0.2, imagenet=0.1, check=positive),
    Setting("lr_base_batch", ("--lr-base-batch",), "the global batch the reference rate is for", OPTIMIZER, int,
            base=256, check=positive_int),
    Setting("momentum", ("--momentum",), "", OPTIMIZER, float, base=0.9, check=fraction),
    Setting("nesterov", ("--nesterov",), "Nesterov momentum", OPTIMIZER, default=False, action="store_true"),
    Setting("sgd_form", ("--sgd-form",), "pytorch: u ← m·u + g, w ← w − η·u; caffe2: v ← m·v + η·g, w ← w − v "
            "(Goyal et al., eqs. 9 and 10)", OPTIMIZER, base="pytorch", choices=SGD.FORMS),
    Setting("momentum_correction", ("--no-momentum-correction",), "with the rate inside the momentum (caffe2, "
            "LARS), do not rescale it when the rate changes", OPTIMIZER, default=True, action="store_false",
            note="corrected"),
    Setting("weight_decay", ("--wd", "--weight-decay"), "", OPTIMIZER, float, embedded=5e-4, imagenet=1e-4,
            check=non_negative),
    Setting("norm_weight_decay", ("--norm-weight-decay",), "weight decay of BN parameters and biases", OPTIMIZER,
            float, check=non_negative, note="the same as --wd"),
    Setting("lars_eta", ("--lars-eta",), "LARS trust coefficient", OPTIMIZER, float, base=0.001, check=positive),
    Setting("label_smoothing", ("--label-smoothing",), "ε of torch's label smoothing", OPTIMIZER, float, base=0.0,
            check=fraction),

    Setting("lr_scheduler", ("--lr-scheduler",), "decay after warmup", SCHEDULE, embedded="cosine",
            imagenet="step", choices=LR_SCHEDULERS),
    Setting("lr_steps", ("--lr-steps",), "epochs where the step scheduler multiplies by --lr-gamma", SCHEDULE,
            int_list, base=(30, 60, 80), check=increasing_epochs),
    Setting("lr_gamma", ("--lr-gamma",), "", SCHEDULE, float, base=0.1, check=gamma),
    Setting("lr_power", ("--lr-power",), "exponent of the poly scheduler", SCHEDULE, float, base=2.0,
            check=non_negative),
    Setting("lr_warmup_epochs", ("--lr-warmup-epochs",), "", SCHEDULE, float, base=0.0, check=non_negative),
    Setting("lr_warmup_method", ("--lr-warmup-method",), "linear: gradual per iteration; constant: hold the start",
            SCHEDULE, base="linear", choices=WARMUP_METHODS),
    Setting("lr_warmup_start", ("--lr-warmup-start",), "rate at the first iteration", SCHEDULE, float,
            check=positive, note="the reference --lr"),

    Setting("allreduce", ("--allreduce",), "how ranks sum their gradients (ring-p2p, torus2d-p2p: ring and "
            "torus2d from point-to-point steps, slower, for study)", DISTRIBUTED, default="torus2d",
            choices=ALGORITHMS),
    Setting("torus_shape", ("--torus-shape",), "XxY grid of ranks for torus2d(-p2p)", DISTRIBUTED, check=torus_shape,
            note="the cost model's fastest for the nodes and buckets"),
    Setting("bucket_mb", ("--bucket-mb",), "gradient buckets reduced during backward (0: one, after backward)",
            DISTRIBUTED, float, default=25.0, check=non_negative),
    Setting("dist_backend", ("--dist-backend",), "transport of the collectives", DISTRIBUTED, choices=BACKENDS,
            note="nccl on GPUs, mpi otherwise"),
    Setting("collective_timeout", ("--collective-timeout",), "seconds a rank may wait for the others in one "
            "collective before the job aborts, naming the stalled ranks (0: wait forever)", DISTRIBUTED, float,
            default=600.0, check=non_negative),
    Setting("stall_warning", ("--stall-warning",), "seconds of waiting in one collective after which rank 0 names "
            "the ranks it waits for (0: never)", DISTRIBUTED, float, default=60.0, check=non_negative),

    Setting("resume", ("--resume",), "a checkpoint to continue from, or auto: the newest in --output-dir",
            CHECKPOINTS, note="start afresh"),
    Setting("checkpoint_every", ("--checkpoint-every",), "iterations between checkpoints, besides the one at each "
            "epoch's end (0: only those)", CHECKPOINTS, int, default=0, check=non_negative),
    Setting("keep_checkpoints", ("--keep-checkpoints",), "how many regular checkpoints to keep", CHECKPOINTS, int,
            default=3, check=positive_int),

    Setting("output_dir", ("--output-dir",), "where config.json, metrics.jsonl and summary.json go", RUN,
            default="runs/latest"),
    Setting("cache_dir", ("--cache-dir",), "where the embedded dataset is generated ($MINIDL_CACHE)", RUN,
            default_factory=environment.cache_dir),
    Setting("seed", ("--seed",), "drives initialization, data order and augmentation", RUN, int, default=0),
    Setting("print_freq", ("--print-freq",), "steps between progress-bar updates", RUN, int, default=10,
            check=positive_int),
    Setting("trace_steps", ("--trace-steps",), "record optimizer steps A to B (counted from 1) on every rank: "
            "modules, buckets, all-reduce stages, into one Chrome trace (Perfetto, chrome://tracing)", RUN,
            check=trace_steps, note="no trace"),
    Setting("trace", ("--trace",), "where --trace-steps writes its trace", RUN, note="OUTPUT_DIR/trace.json"),

    Setting("amp", ("--amp",), "bf16 activations and convolutions, float32 weights, statistics and loss (GPU only)",
            GPU, default=False, action="store_true", check=gpu_only),
    Setting("cuda_graph", ("--cuda-graph",), "capture the training step once in a CUDA graph and replay it (GPU, "
            "one process, SGD); the loss is then checked every --print-freq steps", GPU, default=False,
            action="store_true", check=gpu_only),
)
EMBEDDED_PROFILE = {s.name: s.embedded for s in SETTINGS if s.embedded is not UNSET}
IMAGENET_PROFILE = {s.name: s.imagenet for s in SETTINGS if s.imagenet is not UNSET}
BASE_DEFAULTS = {s.name: s.base for s in SETTINGS if s.base is not UNSET}


def _field(setting):
    if setting.default_factory is not None:
        return dataclasses.field(default_factory=setting.default_factory)
    return dataclasses.field(default=setting.default)


class _Methods:
    def resolved(self, imagenet=None):
        """A copy with the layers' defaults filled in, validated. The dataset profile is ImageNet's
        with a --data-path (or `imagenet`=True: a plan of an ImageNet run), else the embedded one's."""
        if self.recipe is not None and self.recipe not in RECIPES:
            raise UserError(f"unknown --recipe {self.recipe!r}: choose one of {', '.join(RECIPES)}")
        if self.batch_size is not None and self.batch_schedule is not None:
            raise UserError("give either -b/--batch-size (images per rank) or --batch-schedule "
                            "(global batch per epoch), not both")
        imagenet = bool(self.data_path) if imagenet is None else imagenet
        layers = [RECIPES.get(self.recipe, {}), IMAGENET_PROFILE if imagenet else EMBEDDED_PROFILE, BASE_DEFAULTS]
        filled = {}
        for layer in layers:
            for name, value in layer.items():
                if getattr(self, name) is None and name not in filled:
                    filled[name] = value
        # one way to give the batch: an explicit -b beats a recipe's schedule, a schedule beats -b defaults
        if self.batch_size is not None:
            filled.pop("batch_schedule", None)
        elif self.batch_schedule is not None or "batch_schedule" in filled:
            filled["batch_size"] = None
        config = dataclasses.replace(self, **filled)
        config.validate()
        return config

    def batches(self, world_size):
        """The global batch schedule: --batch-schedule, or -b images on every rank throughout."""
        if self.batch_schedule:
            return BatchSchedule.parse(self.batch_schedule, world_size)
        return BatchSchedule([(0, self.batch_size * world_size)])

    def validate(self):
        """Each setting's own check, then the checks that involve several settings."""
        for setting in SETTINGS:
            problem = setting.problem(getattr(self, setting.name))
            if problem:
                raise UserError(problem)
        if not self.batch_schedule and (self.batch_size is None or self.batch_size <= 0):
            raise UserError(f"--batch-size must be a positive integer, got {self.batch_size}")
        if self.nesterov and (self.momentum == 0 or self.opt != "sgd" or self.sgd_form != "pytorch"):
            raise UserError("--nesterov needs --opt sgd, --sgd-form pytorch and a positive --momentum")
        if self.lr_warmup_epochs >= self.epochs:
            raise UserError(f"--lr-warmup-epochs {self.lr_warmup_epochs} leaves no epochs after warmup: "
                            f"make it smaller than --epochs {self.epochs}")
        if self.trace is not None and self.trace_steps is None:
            raise UserError(f"--trace {self.trace} needs --trace-steps A:B to say which steps to trace: add it, "
                            "or drop --trace")
        if self.trace_steps is not None and self.cuda_graph:
            raise UserError("--trace-steps times each module from Python, which a step replayed from a CUDA graph "
                            "does not run: drop --trace-steps or --cuda-graph")
        if self.val_resize_size < self.val_crop_size:
            raise UserError(f"--val-resize-size {self.val_resize_size} is smaller than --val-crop-size "
                            f"{self.val_crop_size}: make it at least the crop size")

    def to_dict(self):
        return dataclasses.asdict(self)

    @property
    def trace_path(self):
        """Where --trace-steps writes its trace."""
        return Path(self.trace) if self.trace else Path(self.output_dir) / "trace.json"

    def to_json(self):
        """The settings that are set, as one JSON line (the run's banner)."""
        return json.dumps({k: v for k, v in self.to_dict().items() if v is not None})


Config = dataclasses.make_dataclass("Config", [(s.name, object, _field(s)) for s in SETTINGS], bases=(_Methods,))
Config.__doc__ = "Every setting of a run (SETTINGS); None: filled by `resolved()` from the layers."
Config.__module__ = __name__
