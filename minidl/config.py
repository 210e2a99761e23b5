"""The training configuration: every knob of a run, its defaults, and its validation.

A field left as None is filled from layers, the first that sets it winning:
  1. a recipe (`--recipe goyal|sony`): the papers' hyper-parameters;
  2. the dataset profile: the embedded default (a CIFAR-style ResNet on the embedded dataset,
     minutes on a laptop CPU) without --data-path, ImageNet's (torchvision's reference) with it;
  3. the base defaults.
Explicit values always win. Validation raises UserError naming the problem and the fix.
"""
import dataclasses
import os
from pathlib import Path

from minidl.backend import require_gpu
from minidl.data import TRAIN_TRANSFORMS
from minidl.dist import ALGORITHMS, BACKENDS, parse_shape
from minidl.errors import UserError
from minidl.models import MODELS
from minidl.optim import SGD
from minidl.schedule import LR_SCHEDULERS, WARMUP_METHODS, BatchSchedule

OPTIMIZERS = ("sgd", "lars")

EMBEDDED_PROFILE = dict(model="resnet20", batch_size=128, epochs=10, lr=0.2, weight_decay=5e-4,
                        lr_scheduler="cosine", train_crop_size=32, val_crop_size=32, val_resize_size=32,
                        augment="cifar")
IMAGENET_PROFILE = dict(model="resnet50", batch_size=32, epochs=90, lr=0.1, weight_decay=1e-4,
                        lr_scheduler="step", train_crop_size=224, val_crop_size=224, val_resize_size=256,
                        augment="imagenet")
BASE_DEFAULTS = dict(lr_base_batch=256, momentum=0.9, label_smoothing=0.0, lr_steps=(30, 60, 80),
                     lr_gamma=0.1, lr_power=2.0, lr_warmup_epochs=0.0, lr_warmup_method="linear",
                     opt="sgd", sgd_form="pytorch", lars_eta=0.001, zero_init_residual=False)

RECIPES = {
    # Goyal et al. 2017: k workers × 32 images, 0.1 per 256 scaled linearly, 5-epoch gradual
    # warmup from 0.1, ÷10 at epochs 30/60/80 of 90, no weight decay on BN and biases, γ = 0
    # in the last BN of every residual block, Caffe2's update with momentum correction.
    "goyal": dict(model="resnet50", batch_size=32, lr=0.1, lr_base_batch=256, lr_warmup_epochs=5.0,
                  lr_warmup_method="linear", lr_warmup_start=0.1, lr_scheduler="step", lr_steps=(30, 60, 80),
                  lr_gamma=0.1, epochs=90, weight_decay=1e-4, momentum=0.9, norm_weight_decay=0.0,
                  zero_init_residual=True, sgd_form="caffe2", bn_group_size=32),
    # In the spirit of Mikami et al. 2018 (224 s on 2176 GPUs): batch-size control from 34K
    # (16 per GPU) to 68K (32 per GPU), label smoothing 0.1, warmup, no weight decay on BN and
    # biases. The switch epoch and the polynomial decay are our choices, not the paper's.
    "sony": dict(model="resnet50", batch_schedule="0:34816,30:69632", lr=0.1, lr_base_batch=256,
                 lr_warmup_epochs=5.0, lr_warmup_method="linear", lr_warmup_start=0.1, lr_scheduler="poly",
                 lr_power=2.0, epochs=90, weight_decay=1e-4, momentum=0.9, norm_weight_decay=0.0,
                 label_smoothing=0.1, zero_init_residual=True),
}


def default_cache_dir():
    return os.environ.get("MINIDL_CACHE") or str(Path.home() / ".cache" / "minidl")


@dataclasses.dataclass
class Config:
    data_path: str | None = None
    recipe: str | None = None
    model: str | None = None
    batch_size: int | None = None  # per process, when there is no batch schedule
    batch_schedule: str | None = None  # "EPOCH:GLOBAL_BATCH,...": the global batch from each epoch on
    max_per_rank_batch: int | None = None  # above it, gradients accumulate over micro-batches
    epochs: int | None = None
    opt: str | None = None
    lr: float | None = None  # the reference rate, for lr_base_batch images
    lr_base_batch: int | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    norm_weight_decay: float | None = None  # None: the same as weight_decay
    nesterov: bool = False
    sgd_form: str | None = None  # "pytorch" (rate outside the momentum) or "caffe2" (inside)
    momentum_correction: bool = True
    lars_eta: float | None = None
    label_smoothing: float | None = None
    lr_scheduler: str | None = None
    lr_steps: tuple | None = None
    lr_gamma: float | None = None
    lr_power: float | None = None
    lr_warmup_epochs: float | None = None
    lr_warmup_method: str | None = None
    lr_warmup_start: float | None = None  # None: the reference rate
    zero_init_residual: bool | None = None
    bn_group_size: int | None = None  # images per BN statistics group ("ghost" BN); None: the micro-batch
    train_crop_size: int | None = None
    val_crop_size: int | None = None
    val_resize_size: int | None = None
    augment: str | None = None
    dist_backend: str | None = None  # None: nccl on GPUs, mpi otherwise
    allreduce: str = "torus2d"
    torus_shape: str | None = None  # "XxY"; None: the squarest grid
    bucket_mb: float = 25.0
    checkpoint_every: int = 0  # iterations between checkpoints (0: only at the end of each epoch)
    keep_checkpoints: int = 3
    resume: str | None = None  # a checkpoint path, or "auto": the newest in output_dir
    output_dir: str = "runs/latest"
    cache_dir: str = dataclasses.field(default_factory=default_cache_dir)
    seed: int = 0
    print_freq: int = 10
    workers: int = 0
    amp: bool = False  # bf16 activations (GPU only)
    cuda_graph: bool = False  # replay each step from a CUDA graph (GPU only)

    def resolved(self):
        """A copy with the layers' defaults filled in, validated."""
        if self.recipe is not None and self.recipe not in RECIPES:
            raise UserError(f"unknown --recipe {self.recipe!r}: choose one of {', '.join(RECIPES)}")
        if self.batch_size is not None and self.batch_schedule is not None:
            raise UserError("give either -b/--batch-size (images per rank) or --batch-schedule "
                            "(global batch per epoch), not both")
        layers = [RECIPES.get(self.recipe, {}), IMAGENET_PROFILE if self.data_path else EMBEDDED_PROFILE,
                  BASE_DEFAULTS]
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
            return BatchSchedule.parse(self.batch_schedule)
        return BatchSchedule([(0, self.batch_size * world_size)])

    def validate(self):
        if self.model not in MODELS:
            raise UserError(f"unknown model {self.model!r}: choose one of {', '.join(MODELS)}")
        if self.batch_schedule:
            BatchSchedule.parse(self.batch_schedule)
        elif self.batch_size is None or self.batch_size <= 0:
            raise UserError(f"--batch-size must be a positive integer, got {self.batch_size}")
        for flag, value in (("--epochs", self.epochs),
                            ("--lr-base-batch", self.lr_base_batch), ("--print-freq", self.print_freq),
                            ("--train-crop-size", self.train_crop_size), ("--val-crop-size", self.val_crop_size),
                            ("--val-resize-size", self.val_resize_size)):
            if value is None or value <= 0:
                raise UserError(f"{flag} must be a positive integer, got {value}")
        if self.bn_group_size is not None and self.bn_group_size <= 0:
            raise UserError(f"--bn-group-size must be a positive integer, got {self.bn_group_size}")
        if self.max_per_rank_batch is not None and self.max_per_rank_batch <= 0:
            raise UserError(f"--max-per-rank-batch must be a positive integer, got {self.max_per_rank_batch}")
        if not self.lr > 0:
            raise UserError(f"--lr must be positive, got {self.lr}")
        if self.lr_warmup_start is not None and not self.lr_warmup_start > 0:
            raise UserError(f"--lr-warmup-start must be positive, got {self.lr_warmup_start}")
        if not 0 <= self.momentum < 1:
            raise UserError(f"--momentum must be in [0, 1), got {self.momentum}")
        for flag, value in (("--wd", self.weight_decay), ("--norm-weight-decay", self.norm_weight_decay),
                            ("--lr-warmup-epochs", self.lr_warmup_epochs), ("--lr-power", self.lr_power)):
            if value is not None and value < 0:
                raise UserError(f"{flag} must be >= 0, got {value}")
        if self.sgd_form not in SGD.FORMS:
            raise UserError(f"unknown --sgd-form {self.sgd_form!r}: choose one of {', '.join(SGD.FORMS)}")
        if self.nesterov and (self.momentum == 0 or self.opt != "sgd" or self.sgd_form != "pytorch"):
            raise UserError("--nesterov needs --opt sgd, --sgd-form pytorch and a positive --momentum")
        if self.opt not in OPTIMIZERS:
            raise UserError(f"unknown --opt {self.opt!r}: choose one of {', '.join(OPTIMIZERS)}")
        if not self.lars_eta > 0:
            raise UserError(f"--lars-eta must be positive, got {self.lars_eta}")
        if not 0 <= self.label_smoothing < 1:
            raise UserError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.lr_scheduler not in LR_SCHEDULERS:
            raise UserError(f"unknown --lr-scheduler {self.lr_scheduler!r}: choose one of {', '.join(LR_SCHEDULERS)}")
        if self.lr_warmup_method not in WARMUP_METHODS:
            raise UserError(f"unknown --lr-warmup-method {self.lr_warmup_method!r}: choose one of "
                            f"{', '.join(WARMUP_METHODS)}")
        if self.lr_warmup_epochs >= self.epochs:
            raise UserError(f"--lr-warmup-epochs {self.lr_warmup_epochs} leaves no epochs after warmup: "
                            f"make it smaller than --epochs {self.epochs}")
        if not 0 < self.lr_gamma <= 1:
            raise UserError(f"--lr-gamma must be in (0, 1], got {self.lr_gamma}")
        if list(self.lr_steps) != sorted(self.lr_steps) or any(step <= 0 for step in self.lr_steps):
            raise UserError(f"--lr-steps must be increasing positive epochs, got {','.join(map(str, self.lr_steps))}")
        if self.augment not in TRAIN_TRANSFORMS:
            raise UserError(f"unknown --augment {self.augment!r}: choose one of {', '.join(TRAIN_TRANSFORMS)}")
        if self.val_resize_size < self.val_crop_size:
            raise UserError(f"--val-resize-size {self.val_resize_size} is smaller than --val-crop-size "
                            f"{self.val_crop_size}: make it at least the crop size")
        if self.allreduce not in ALGORITHMS:
            raise UserError(f"unknown --allreduce {self.allreduce!r}: choose one of {', '.join(ALGORITHMS)}")
        if self.dist_backend not in (None, *BACKENDS):
            raise UserError(f"unknown --dist-backend {self.dist_backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.torus_shape is not None:
            parse_shape(self.torus_shape)
        if self.bucket_mb < 0 or self.checkpoint_every < 0 or self.keep_checkpoints < 1:
            raise UserError("--bucket-mb and --checkpoint-every must be >= 0 and --keep-checkpoints >= 1, got "
                            f"{self.bucket_mb}, {self.checkpoint_every}, {self.keep_checkpoints}")
        if self.workers < 0:
            raise UserError(f"--workers must be >= 0, got {self.workers}")
        for flag, wanted in (("--amp", self.amp), ("--cuda-graph", self.cuda_graph)):
            if wanted:
                require_gpu(flag)

    def to_dict(self):
        return dataclasses.asdict(self)
