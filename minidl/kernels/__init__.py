"""The CUDA kernels of kernels/*.cu from Python, and the rule that decides when they run.

One launcher module per kernel family, named like its source (`conv.py` ↔ kernels/conv.cu),
holds its kernel names, shared constants, launch geometry and tiles; `Kernels` gathers every
family's launch methods, `device()` for the current GPU, `tuner_for` a device's autotuner.
Which implementation a call runs is decided in ONE place, `serving(*arrays)`: the kernels
for their array type (CuPy on a GPU) in float32 or bf16, else the reference ops of minidl.ops.

Details: docs/kernels.md, "minidl/kernels/__init__.py".
"""
import contextlib
import dataclasses
import functools
import importlib

import numpy

from minidl import environment
from minidl.backend import on_gpu
from minidl.errors import UserError
from minidl.kernels import (amp, autotune, batchnorm, conv, conv_v0, conv_v2, conv_v3, loader, normconv, pool, sgd,
                            softmax_xent)
from minidl.kernels.launch import KERNEL_DTYPES

FAMILIES = {family.FAMILY: family for family in (conv, conv_v0, conv_v2, conv_v3, batchnorm, pool, softmax_xent, sgd,
                                                  amp)}


class Kernels(conv.ConvKernels, batchnorm.BatchNormKernels, normconv.NormConvKernels, pool.PoolKernels,
              softmax_xent.SoftmaxXentKernels, sgd.SgdKernels, amp.AmpKernels):
    """Every kernel operation, launched through `load(family).get_function(name)`."""

    def __init__(self, load, multiprocessors, allow_tf32=True, tuner=None, compute_capability=None):
        super().__init__(load, multiprocessors, compute_capability)
        self.allow_tf32, self.tuner = allow_tf32, tuner


def load_family(family):
    """kernels/<family>.cu compiled for this GPU (and the architecture the family needs), with the
    family's kernel names and constants."""
    module = FAMILIES[family]
    return loader.load_rawmodule(family, module.NAMES, tuple(sorted(module.DEFINES.items())),
                                 loader.required_arch(module))


def tuner_for(device_name, cuda_version, timer, capturing=lambda: False, compute_capability=None):
    """The autotuner of a device, or None where MINIDL_AUTOTUNE=0: validated by the canary in
    child processes (the plans of every family this `compute_capability` runs; None: all of
    them), its results in MINIDL_CACHE/autotune/<device>-cuda<version>.json; where
    MINIDL_CANARY=0, no validation and no cache (whose verdicts would let v2 plans run)."""
    if not environment.value("MINIDL_AUTOTUNE"):
        return None
    from minidl.kernels import canary  # not at import: `python -m minidl.kernels.canary` runs it as __main__
    if not environment.value("MINIDL_CANARY"):
        return autotune.Autotuner(timer, None, capturing, canary.source_hash(), device_name)
    return autotune.Autotuner(timer, autotune.cache_path(environment.cache_dir(), device_name, cuda_version),
                              capturing, canary.source_hash(), device_name,
                              canary.validator(compute_capability=compute_capability))


def _gpu():
    import cupy
    gpu = cupy.cuda.Device()
    name = cupy.cuda.runtime.getDeviceProperties(gpu.id)["name"]
    tuner = tuner_for(name.decode() if isinstance(name, bytes) else name, cupy.cuda.runtime.runtimeGetVersion(),
                      autotune.windowed_timer(autotune.cuda_window(cupy)),
                      lambda: cupy.cuda.get_current_stream().is_capturing(), gpu.compute_capability)
    kernels = Kernels(load_family, gpu.attributes["MultiProcessorCount"], allow_tf32=environment.value("MINIDL_TF32"),
                      tuner=tuner, compute_capability=gpu.compute_capability)
    return kernels, cupy.ndarray


@functools.lru_cache(maxsize=None)
def _device_and_array_type():
    """(Kernels, array type) of the device: MINIDL_DEVICE_KERNELS's function's, else the GPU's."""
    seam = environment.value("MINIDL_DEVICE_KERNELS")
    if seam is None:
        return _gpu()
    module, function = seam
    try:
        make = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as error:
        raise UserError(f"MINIDL_DEVICE_KERNELS={module}:{function}: {error}: put the module's folder on "
                        "PYTHONPATH, or unset the variable") from None
    return make()


def device():
    """The Kernels of the device (the current GPU), with the autotuner unless MINIDL_AUTOTUNE=0."""
    return _device_and_array_type()[0]


def device_array_module():
    """The array module of the device's arrays: CuPy on a GPU, NumPy for emulated kernels."""
    array_type = _device_and_array_type()[1]
    if issubclass(array_type, numpy.ndarray):
        return numpy
    return importlib.import_module(array_type.__module__.split(".")[0])


@dataclasses.dataclass(frozen=True)
class _InCharge:
    kernels: object  # a Kernels, or None: the reference implementations only
    array_type: type


@functools.lru_cache(maxsize=None)
def _default():
    if environment.value("MINIDL_KERNELS") and (on_gpu or environment.value("MINIDL_DEVICE_KERNELS")):
        return _InCharge(*_device_and_array_type())
    return _InCharge(None, None)


_override = None  # an _InCharge set by use()


def _in_charge():
    return _override if _override is not None else _default()


def active():
    """The Kernels in use, or None where every operation runs its reference implementation."""
    return _in_charge().kernels


def serving(*arrays):
    """The Kernels that should compute on `arrays` (None entries ignored), or None for the
    reference implementation: THE rule of which implementation runs."""
    charge = _in_charge()
    if charge.kernels is None:
        return None
    if all(a is None or (isinstance(a, charge.array_type) and a.dtype in KERNEL_DTYPES) for a in arrays):
        return charge.kernels
    return None


@contextlib.contextmanager
def use(kernels, array_type):
    """Inside, `kernels` serve float32 and bf16 arrays of `array_type` (the CPU emulator: NumPy)."""
    global _override
    previous, _override = _override, _InCharge(kernels, array_type)
    try:
        yield kernels
    finally:
        _override = previous


def tuning_report():
    """The autotuner's report (minidl.kernels.autotune) of the kernels in use, or None without one."""
    tuner = getattr(active(), "tuner", None)
    return None if tuner is None else tuner.report()
