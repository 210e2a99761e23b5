"""What the study varies: its rows, the design they share, and the configuration of one run.

Every row trains the same model on the same data for the same number of epochs with the same
schedule shape; a row changes only its knob (global batch, warmup, batch-size control, label
smoothing, the optimizer); part 6's rows share another schedule shape (You et al.'s polynomial
decay) and each has a rate of its own, tuned. The global batch k·n is k simulated workers of n = 32
images, each with its own batch norm: the engine's ghost BN over groups of 32 inside micro-batches
of up to `micro_batch` images (above it, gradients accumulate), which trains exactly like k workers
of 32 (tests/training/test_recipe.py). The rate follows the linear scaling rule from `lr` per 32.
"""
import dataclasses

from minidl.config import Config
from minidl.data.embedded import EMBEDDED_CLASSES

N = 32  # images per simulated worker
WARMUPS = ("gradual", "constant", "none")
PARTS = (1, 2, 3, 4, 5, 6)  # the study's parts; part 1 always runs: B* rests on it
DEFAULT_PARTS = PARTS[:5]  # part 6 (52 runs of its own) runs only where --parts names it
LARS_MULTIPLES = (2, 4, 8)  # LARS rows at these multiples of B*
SCHEDULES = ("step", "poly")  # the decay after warmup: the study's steps, or You et al.'s polynomial
POLY_POWER = 2.0  # You et al.'s exponent of the polynomial decay


@dataclasses.dataclass(frozen=True)
class Design:
    """What all rows share (the command line's settings)."""
    model: str = "resnet8_w8"
    image_size: int = 16
    difficulty: str = "default"
    label_noise: float = 0.0  # the fraction of training images filed under another class
    train_per_class: int = 2000
    val_per_class: int = 500
    epochs: int = 10
    warmup_epochs: float = 2.0
    lr: float = 0.2  # per N images, the small batch's rate: the best of --lr-sweep 0.025,0.05,0.1,0.2,0.4
    weight_decay: float = 5e-4
    max_batch: int = 512  # the largest global batch of the sweep over batch sizes
    micro_batch: int = 512  # images per forward/backward pass
    control_epoch: int = 3  # batch-size control: the epoch from which the batch doubles
    label_smoothing: float = 0.1
    seeds: tuple = (0, 1, 2)  # parts 2, 3, 4 and 5's batch sweep (and --lr-sweep)
    batch_seeds: tuple = (0, 1, 2, 3, 4)  # part 1: B* rests on the small batch's spread
    # part 4, LARS's reference rate per N: the best of
    # --lr-sweep 0.25,0.5,1,2 --tune lars --tune-batch 256 --seeds 100
    lars_lr: float = 2.0
    # part 5, label smoothing where labels are noisy: its own data, rate, B* and seeds
    ls_label_noise: float = 0.4
    ls_train_per_class: int = 1000
    ls_lr: float = 0.2  # the best of --lr-sweep 0.05,0.1,0.2,0.4 --tune label-noise --seeds 100
    ls_seeds: tuple = (0, 1, 2, 3, 4)
    # part 6, LARS and SGD under You et al.'s protocol, each rate retuned per batch on a seed not reported
    protocol_b_star: int = 128  # its rows at 2, 4, 8 times this, the published B* (they do not wait on part 1)
    protocol_lars_rates: tuple = (0.25, 0.5, 1.0, 2.0, 4.0)  # per N
    protocol_sgd_rates: tuple = (0.05, 0.1, 0.2, 0.4)  # per N
    tuning_seed: int = 100
    workers: int = 1  # data loader processes

    @property
    def train_size(self):
        return self.train_per_class * len(EMBEDDED_CLASSES)

    @property
    def dataset_name(self):
        return (f"embedded-{self.difficulty}-{self.image_size}px-{self.train_per_class}x{len(EMBEDDED_CLASSES)}"
                f"-val{self.val_per_class}" + (f"-noise{self.label_noise:g}" if self.label_noise else ""))

    def noisy(self):
        """The design of part 5's rows: the same rows and schedule on data with noisy labels."""
        return dataclasses.replace(self, label_noise=self.ls_label_noise, train_per_class=self.ls_train_per_class,
                                   lr=self.ls_lr)


@dataclasses.dataclass(frozen=True)
class Row:
    batch: int                     # the global batch k·n from epoch 0
    warmup: str = "gradual"        # one of WARMUPS
    doubles_at: int | None = None  # batch-size control: the global batch doubles from this epoch on
    label_smoothing: float = 0.0
    opt: str = "sgd"               # or "lars", at the design's lars_lr
    schedule: str = "step"         # one of SCHEDULES
    lr: float | None = None        # the rate per N; None: the design's rate of the row's optimizer

    @property
    def name(self):
        text = f"k·n = {self.batch}"
        if self.doubles_at is not None:
            text += f" → {2 * self.batch} at epoch {self.doubles_at}"
        if self.batch > N:  # one worker: warmup from the reference rate to itself changes nothing
            text += ", no warmup" if self.warmup == "none" else f", {self.warmup} warmup"
        if self.label_smoothing:
            text += f", label smoothing {self.label_smoothing:g}"
        if self.schedule == "poly":
            text += ", poly decay"
        if self.lr is not None:
            text += f", η = {self.lr:g} per {N}"
        return text + (", LARS" if self.opt == "lars" else "")

    @property
    def key(self):
        """The row's folder name."""
        key = f"b{self.batch}" + (f"-x2at{self.doubles_at}" if self.doubles_at is not None else "")
        key += f"-{self.warmup}" + (f"-ls{self.label_smoothing:g}" if self.label_smoothing else "")
        key += ("-poly" if self.schedule == "poly" else "") + (f"-lr{self.lr:g}" if self.lr is not None else "")
        return key + ("-lars" if self.opt == "lars" else "")

    def batch_schedule(self):
        if self.doubles_at is None:
            return f"0:{self.batch}"
        return f"0:{self.batch},{self.doubles_at}:{2 * self.batch}"

    def global_batch(self, epoch):
        return self.batch if self.doubles_at is None or epoch < self.doubles_at else 2 * self.batch

    def steps(self, design):
        """Optimizer steps over the whole run (an epoch drops its last partial batch)."""
        return sum(design.train_size // self.global_batch(epoch) for epoch in range(design.epochs))


def batch_rows(design):
    """Part 1: the global batch from n to the largest, doubling, all with gradual warmup."""
    batches, batch = [], N
    while batch <= design.max_batch:
        batches.append(batch)
        batch *= 2
    return [Row(batch) for batch in batches]


def warmup_rows(b_star):
    """Part 2: no, constant and gradual warmup at B* and 2·B* (one worker has nothing to warm
    up: B* = n leaves only its row), and the small batch."""
    return [Row(N)] + [Row(batch, warmup) for batch in (b_star, 2 * b_star) if batch > N
                       for warmup in reversed(WARMUPS)]


def control_rows(b_star, design):
    """Part 3: B* doubling part-way vs a fixed 2·B* (and B* itself); label smoothing at the largest batch."""
    return [Row(b_star), Row(2 * b_star), Row(b_star, doubles_at=design.control_epoch),
            Row(design.max_batch), Row(design.max_batch, label_smoothing=design.label_smoothing)]


def lars_rows(b_star):
    """Part 4: LARS and SGD at 2, 4 and 8·B*, the same gradual warmup as every row."""
    return [Row(m * b_star, opt=opt) for m in LARS_MULTIPLES for opt in ("sgd", "lars")]


def smoothing_rows(b_star, design):
    """Part 5 (on the noisy design): no smoothing against smoothing at B* and 2·B* of that data."""
    return [Row(batch, label_smoothing=ls) for batch in (b_star, 2 * b_star) for ls in (0.0, design.label_smoothing)]


def protocol_cells(design):
    """Part 6's (batch, optimizer) pairs: SGD at k·n = N, the reference, then SGD and LARS at 2, 4 and 8
    times the design's protocol_b_star."""
    return [(N, "sgd")] + [(m * design.protocol_b_star, opt) for m in LARS_MULTIPLES for opt in ("sgd", "lars")]


def protocol_rates(design, opt):
    """The rates per N part 6 tunes `opt` over."""
    return design.protocol_lars_rates if opt == "lars" else design.protocol_sgd_rates


def protocol_row(batch, opt, rate):
    """A row of part 6: gradual warmup from `rate`, then the polynomial decay to zero at the last epoch."""
    return Row(batch, opt=opt, schedule="poly", lr=rate)


def protocol_tuning_rows(design):
    """Part 6's tuning: every (batch, optimizer) pair at each of its optimizer's rates."""
    return [protocol_row(batch, opt, rate) for batch, opt in protocol_cells(design)
            for rate in protocol_rates(design, opt)]


def config_for(row, seed, design, data_path, output_dir):
    """The training configuration of one row and seed (resumes from its own checkpoint)."""
    e = design.epochs
    lr = row.lr if row.lr is not None else design.lars_lr if row.opt == "lars" else design.lr
    return Config(data_path=str(data_path), model=design.model, batch_schedule=row.batch_schedule(),
                  max_per_rank_batch=design.micro_batch, bn_group_size=N, epochs=e, lr=lr, lr_base_batch=N, opt=row.opt,
                  lr_scheduler=row.schedule, lr_steps=(e // 2, e * 3 // 4), lr_gamma=0.1,
                  lr_power=POLY_POWER if row.schedule == "poly" else None,
                  lr_warmup_epochs=0.0 if row.warmup == "none" else design.warmup_epochs,
                  lr_warmup_method="constant" if row.warmup == "constant" else "linear", lr_warmup_start=lr,
                  momentum=0.9, weight_decay=design.weight_decay, norm_weight_decay=0.0, zero_init_residual=True,
                  sgd_form="caffe2", label_smoothing=row.label_smoothing, train_crop_size=design.image_size,
                  val_crop_size=design.image_size, val_resize_size=design.image_size, augment="cifar", seed=seed,
                  output_dir=str(output_dir), resume="auto", keep_checkpoints=1, print_freq=100,
                  workers=design.workers)
