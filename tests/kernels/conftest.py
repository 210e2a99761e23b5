"""Fixtures for the kernel checks: the kernel operations of minidl.kernels running on the CPU
emulator (all kernel families compiled up front, two compilers at a time, when the cache is cold)."""
import shutil

import numpy
import pytest

import emulator
from minidl import kernels
from minidl.kernels import loader

EMULATED_MULTIPROCESSORS = 2  # small: grids and split-K take their multi-block paths on small shapes
FAMILIES = ("conv_v2", "conv", "batchnorm", "pool", "softmax_xent", "sgd", "amp")  # the slowest to compile first


def emulation_job(family):
    """(source path, kernel names, defines) of a family, as the emulator compiles it."""
    module = kernels.FAMILIES[family]
    return str(loader.source_path(family)), module.NAMES, tuple(sorted(module.DEFINES.items()))


def emulated_module(family):
    return emulator.load(*emulation_job(family))


@pytest.fixture(scope="session")
def emulated():
    """minidl.kernels.Kernels over the emulator: NumPy arrays in, the .cu sources run on threads."""
    if shutil.which(emulator.CXX) is None:
        pytest.skip(f"{emulator.CXX} not found: the CPU emulation of the kernels needs a C++20 compiler")
    emulator.build([emulation_job(f) for f in FAMILIES])
    return kernels.Kernels(emulated_module, EMULATED_MULTIPROCESSORS)


@pytest.fixture(scope="session")
def emulated_wide(emulated):
    """The emulated kernels as on a GPU of 64 multiprocessors: grids of many blocks, e.g. more
    batch-norm slabs than the finalize kernels have lanes."""
    return kernels.Kernels(emulated_module, 64)


@pytest.fixture
def emulated_gpu(emulated):
    """minidl as on a GPU, its kernels emulated: the emulated kernels serve NumPy float32 and bf16
    arrays (float64 ones keep the reference path: the oracles)."""
    with kernels.use(emulated, numpy.ndarray):
        yield emulated
