"""Fixtures for the kernel checks: the kernel operations of minidl.kernels running on the CPU
emulator (all kernel families compiled up front, two compilers at a time, when the cache is cold)."""
import shutil

import numpy
import pytest

import emulator
from emulated_device import EMULATED_MULTIPROCESSORS, build, emulated_module
from minidl import kernels


@pytest.fixture(scope="session")
def emulated():
    """minidl.kernels.Kernels over the emulator: NumPy arrays in, the .cu sources run on threads."""
    if shutil.which(emulator.CXX) is None:
        pytest.skip(f"{emulator.CXX} not found: the CPU emulation of the kernels needs a C++20 compiler")
    build()
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
