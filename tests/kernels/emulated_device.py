"""The CPU emulator as a device: minidl.kernels.Kernels over kernels/*.cu compiled by g++
(tests/kernels/emulator.py), for the fixtures here and for whole processes through

    PYTHONPATH=<checkout>:<checkout>/tests/kernels MINIDL_DEVICE_KERNELS=emulated_device:device

`device()` returns (Kernels, numpy.ndarray): its autotuner times on the wall clock, keeps its
cache under MINIDL_CACHE like a GPU's (device "emulator"), and is validated by the canary.

Fault injection, for tests of what survives a broken kernel (the product has none of it):
EMULATED_DEVICE_BREAK=v2 makes every launch of a conv_v2 kernel kill its process as a sticky GPU
fault loses it ("illegal address (injected)" on stderr, then abort); EMULATED_DEVICE_BREAK=v2-wrong
makes the conv_v2 kernels write a wrong result, EMULATED_DEVICE_BREAK=v2-hang never return (a
kernel that deadlocks); v3, v3-wrong and v3-hang do the same to the conv_v3 kernels (a split
plan's sum, splitk_reduce, among them); EMULATED_DEVICE_BREAK_KERNELS=TEXT limits any of them
to the kernels whose name holds TEXT (e.g. "256, 128, 64": the bf16 256×128 tile of v2).
"""
import os
import sys
import time

import numpy

import emulator
from minidl import environment, kernels
from minidl.kernels import autotune, loader
from minidl.kernels.conv import LATER_VERSIONS

EMULATED_MULTIPROCESSORS = 2  # small: grids and split-K take their multi-block paths on small shapes
FAMILIES = ("conv_v2", "conv_v3", "conv", "batchnorm", "pool", "softmax_xent", "sgd", "amp", "conv_v0")  # slowest first
BREAKS = tuple(version + how for version in LATER_VERSIONS for how in ("", "-wrong", "-hang"))
CUDA_VERSION = "emu"


def emulation_job(family):
    """(source path, kernel names, defines) of a family, as the emulator compiles it."""
    module = kernels.FAMILIES[family]
    return str(loader.source_path(family)), module.NAMES, tuple(sorted(module.DEFINES.items()))


def emulated_module(family):
    return emulator.load(*emulation_job(family))


def build():
    """Compile every family for emulation (two compilers at a time when the cache is cold)."""
    emulator.build([emulation_job(f) for f in FAMILIES])


class BrokenModule:
    """A conv_v2 or conv_v3 module whose kernels fail as EMULATED_DEVICE_BREAK says ("fault",
    "wrong" or "hang")."""

    def __init__(self, module, how, only):
        self.module, self.how, self.only = module, how, only

    def get_function(self, name):
        kernel = self.module.get_function(name)
        return BrokenKernel(kernel, self.how) if self.only in name else kernel


class BrokenKernel:
    def __init__(self, kernel, how):
        self.kernel, self.how = kernel, how

    max_dynamic_shared_size_bytes = property(lambda self: self.kernel.max_dynamic_shared_size_bytes,
                                             lambda self, value: setattr(self.kernel, "max_dynamic_shared_size_bytes",
                                                                         value))

    def __call__(self, grid, block, args, shared_mem=0):
        name = self.kernel.name
        if self.how == "fault":
            sys.stderr.write(f"{name}: illegal address (injected)\n")
            sys.stderr.flush()
            os.abort()
        if self.how == "hang":
            time.sleep(3600)
        self.kernel(grid, block, args, shared_mem=shared_mem)
        for out in args[1:2] if name.startswith("splitk_reduce") else args[2:4]:
            if isinstance(out, numpy.ndarray):
                out[...] = 0x447A if out.dtype == numpy.uint16 else 1000.0  # 1000 in bf16 bits, in float32


def device_module(family):
    """The emulated module of a family, broken where EMULATED_DEVICE_BREAK asks."""
    how = os.environ.get("EMULATED_DEVICE_BREAK", "")
    if how and how not in BREAKS:
        raise ValueError(f"EMULATED_DEVICE_BREAK={how!r}: one of {', '.join(BREAKS)}, or unset")
    module = emulated_module(family)
    version, _, failure = how.partition("-")
    if not how or family != LATER_VERSIONS[version].FAMILY:
        return module
    return BrokenModule(module, failure or "fault", os.environ.get("EMULATED_DEVICE_BREAK_KERNELS", ""))


def device():
    """(Kernels over the emulator, numpy.ndarray), tuned like a GPU's (MINIDL_DEVICE_KERNELS)."""
    build()
    tuner = kernels.tuner_for("emulator", CUDA_VERSION, autotune.windowed_timer(autotune.wall_window, windows=1))
    emulated = kernels.Kernels(device_module, EMULATED_MULTIPROCESSORS, allow_tf32=environment.value("MINIDL_TF32"),
                               tuner=tuner)
    return emulated, numpy.ndarray
