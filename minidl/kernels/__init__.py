"""The CUDA kernels of kernels/*.cu from Python, and the rule that decides when they run.

One launcher module per kernel family, named like its source (`conv.py` ↔ kernels/conv.cu):
its kernel names, the constants it shares with the source (passed to the compiler, never
written twice), launch geometry, tile choice and workspaces. `loader` finds and compiles the
sources. `Kernels(load, multiprocessors)` is every family's launch methods in one object; on a
GPU `device()` is the one for the current GPU, and tests/kernels builds one over a CPU emulator
of the same sources, so every line of the launchers also runs in CI, on NumPy arrays.

Which implementation an operation runs is decided in ONE place, `serving(*arrays)`: the
kernels in use serve arrays of their array type (CuPy on a GPU) holding float32 or bf16
(BF16 bits); anything else (NumPy arrays, float64, no GPU, MINIDL_KERNELS=0) runs the
reference implementation of minidl.ops. `use(kernels, array_type)` puts other kernels in
charge for a while (the emulator takes NumPy arrays).
"""
import contextlib
import dataclasses
import functools

from minidl import environment
from minidl.backend import on_gpu
from minidl.kernels import amp, autotune, batchnorm, conv, conv_v2, loader, normconv, pool, sgd, softmax_xent
from minidl.kernels.launch import KERNEL_DTYPES

FAMILIES = {family.FAMILY: family for family in (conv, conv_v2, batchnorm, pool, softmax_xent, sgd, amp)}


class Kernels(conv.ConvKernels, batchnorm.BatchNormKernels, normconv.NormConvKernels, pool.PoolKernels,
              softmax_xent.SoftmaxXentKernels, sgd.SgdKernels, amp.AmpKernels):
    """Every kernel operation, launched through `load(family).get_function(name)`."""

    def __init__(self, load, multiprocessors, allow_tf32=True, tuner=None):
        super().__init__(load, multiprocessors)
        self.allow_tf32, self.tuner = allow_tf32, tuner


def load_family(family):
    """kernels/<family>.cu compiled for this GPU, with the family's kernel names and constants."""
    module = FAMILIES[family]
    return loader.load_rawmodule(family, module.NAMES, tuple(sorted(module.DEFINES.items())))


@functools.lru_cache(maxsize=None)
def device():
    """The Kernels of the current GPU, with the autotuner unless MINIDL_AUTOTUNE=0."""
    import cupy
    gpu = cupy.cuda.Device()
    tuner = None
    if environment.value("MINIDL_AUTOTUNE"):
        name = cupy.cuda.runtime.getDeviceProperties(gpu.id)["name"]
        path = autotune.cache_path(environment.cache_dir(), name.decode() if isinstance(name, bytes) else name,
                                   cupy.cuda.runtime.runtimeGetVersion())
        tuner = autotune.Autotuner(autotune.cuda_timer(cupy), path,
                                   capturing=lambda: cupy.cuda.get_current_stream().is_capturing())
    return Kernels(load_family, gpu.attributes["MultiProcessorCount"], allow_tf32=environment.value("MINIDL_TF32"),
                   tuner=tuner)


@dataclasses.dataclass(frozen=True)
class _InCharge:
    kernels: object  # a Kernels, or None: the reference implementations only
    array_type: type


@functools.lru_cache(maxsize=None)
def _default():
    if on_gpu and environment.value("MINIDL_KERNELS"):
        import cupy
        return _InCharge(device(), cupy.ndarray)
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
