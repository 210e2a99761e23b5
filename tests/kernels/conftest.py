"""Fixtures for the kernel checks: the kernel operations of minidl.kernels running on the CPU
emulator (all kernel families compiled up front, two compilers at a time, when the cache is cold)."""
import shutil

import pytest

import emulator
from minidl import backend, kernels

EMULATED_MULTIPROCESSORS = 2  # small: grids and split-K take their multi-block paths on small shapes
FAMILIES = ("conv", "batchnorm", "pool", "softmax_xent", "sgd", "amp")  # the slowest to compile first


def source(family):
    return str(kernels.SOURCE_DIR / f"{family}.cu")


def emulated_module(family):
    return emulator.load(source(family), kernels.KERNELS[family])


@pytest.fixture(scope="session")
def emulated():
    """minidl.kernels.Kernels over the emulator: NumPy arrays in, the .cu sources run on threads."""
    if shutil.which(emulator.CXX) is None:
        pytest.skip(f"{emulator.CXX} not found: the CPU emulation of the kernels needs a C++20 compiler")
    emulator.build([(source(f), kernels.KERNELS[f]) for f in FAMILIES])
    return kernels.Kernels(emulated_module, EMULATED_MULTIPROCESSORS)


@pytest.fixture(scope="session")
def emulated_wide(emulated):
    """The emulated kernels as on a GPU of 64 multiprocessors: grids of many blocks, e.g. more
    batch-norm slabs than the finalize kernels have lanes."""
    return kernels.Kernels(emulated_module, 64)


@pytest.fixture
def emulated_gpu(emulated, monkeypatch):
    """minidl as on a GPU, its kernels emulated: kernels.device() is `emulated`, kernels.wants()
    takes NumPy float32 and bf16 arrays (float64 ones keep the reference path: the oracles), and
    backend.on_gpu is True (the GPU-only features check it)."""
    monkeypatch.setattr(kernels, "device", lambda: emulated)
    monkeypatch.setattr(kernels, "wants", lambda *arrays: all(a is None or a.dtype in kernels.KERNEL_DTYPES
                                                              for a in arrays))
    monkeypatch.setattr(backend, "on_gpu", True)
    return emulated
