"""The objects a run is made of, built from its configuration: schedule, model, optimizer."""
from minidl import nn
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
