"""The objects a run is made of, built from its configuration: schedule, model, optimizer, and
the kernel tuner's agreement over the ranks."""
from minidl import kernels, nn
from minidl.data import open_dataset
from minidl.data.embedded import EMBEDDED_CLASSES, TRAIN_PER_CLASS
from minidl.models import MODELS
from minidl.optim import LARS, SGD
from minidl.schedule import LRSchedule, epoch_table


def train_dataset_size(config):
    """Training images, counted without decoding any (the embedded dataset's size is known)."""
    if not config.data_path:
        return TRAIN_PER_CLASS * len(EMBEDDED_CLASSES)
    return len(open_dataset(config.data_path, "train"))


def build_schedule(config, world_size):
    return LRSchedule(config.lr, config.lr_base_batch, config.batches(world_size), config.epochs,
                      config.lr_scheduler, tuple(config.lr_steps), config.lr_gamma, config.lr_power,
                      config.lr_warmup_epochs, config.lr_warmup_method, config.lr_warmup_start)


def schedule_rows(config, world_size, dataset_size=None):
    """The per-epoch batch layout and rate (`--print-schedule`)."""
    dataset_size = train_dataset_size(config) if dataset_size is None else dataset_size
    return epoch_table(build_schedule(config, world_size), world_size, dataset_size, config.max_per_rank_batch)


def build_model(config, num_classes):
    nn.manual_seed(config.seed)
    model = MODELS[config.model](num_classes=num_classes, zero_init_residual=config.zero_init_residual,
                                 fuse=config.fuse)
    for _, module in model.named_modules():
        if isinstance(module, nn.BatchNorm2d):
            module.group_size = config.bn_group_size
    return model


def build_optimizer(config, model, align):
    common = dict(lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay,
                  norm_weight_decay=config.norm_weight_decay, align=align,
                  momentum_correction=config.momentum_correction)
    if config.opt == "lars":
        return LARS(model.parameters(), eta=config.lars_eta, **common)
    return SGD(model.parameters(), nesterov=config.nesterov, form=config.sgd_form, **common)


class RankAgreement:
    """The autotuner's agreement over the ranks of a job (minidl.kernels.autotune): local rank 0
    validates for its node, the failed plans are combined over every rank, rank 0 decides each
    key for all. On a duplicate of the world communicator, over MPI (Python objects), so these
    collectives never match the gradient reducer's, which it starts on the main thread during
    backward, where tuned convolutions run too (a duplicate shares NCCL, objects never use it)."""

    def __init__(self, comm):
        self.comm, self.leads_node = comm.dup(), comm.local_rank == 0

    def union(self, names):
        return set().union(*self.comm.allgather_object(sorted(names)))

    def decide(self, function):
        return self.comm.allgather_object(function() if self.comm.rank == 0 else None)[0]


def agree_on_kernel_plans(comm):
    """With several ranks, the kernels' tuner validates once per node and decides once for all."""
    tuner = getattr(kernels.active(), "tuner", None)
    if tuner is not None and comm.size > 1:
        tuner.agreement = RankAgreement(comm)
