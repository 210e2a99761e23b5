"""Run the CUDA sources in kernels/*.cu on the CPU, unchanged, from Python.

`load(path, names, defines)` compiles one .cu file with g++ against the emulation header
(emu/cuda_emu.h), with `defines` (the family's constants, minidl.kernels.loader) as -D options,
into a shared library and returns a module object with CuPy's RawModule interface:
`module.get_function(name)(grid, block, args, shared_mem=0)`. So minidl.kernels, which builds
every launch (geometry, workspaces, argument lists), runs the same Python code here as on a GPU,
with NumPy arrays in place of CuPy arrays.

What a launch checks, beyond what the header checks inside the kernel:
- every argument against the kernel's C++ parameter type: arrays by dtype (bf16 = uint16 bits)
  and contiguity, scalars by exact NumPy type (CuPy would pass a Python int as 64 bits), null
  pointers only as `numpy.uint64(0)` (CuPy turns None into a bad pointer);
- out-of-bounds accesses: each array is staged between guard bytes filled with 0xFF (a NaN for
  floats, so an out-of-bounds read poisons the result) and a changed guard is a failed launch.
(Shared-memory bounds and the GPU's flush-to-zero are the header's: emu/cuda_emu.h.)

Libraries are cached by a hash of the source and its quoted includes (recursively), the headers
and the compiler flags, in $MINIDL_EMU_CACHE or ~/.cache/minidl/cuda-emu, so repeated test runs do not
recompile.
"""
import ctypes
import functools
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

import numpy

from minidl.kernels.loader import define_options, included_sources

EMU_DIR = Path(__file__).resolve().parent / "emu"
CXX = os.environ.get("CXX", "g++")
FLAGS = ["-std=c++20", "-O2", "-fPIC", "-shared", "-pthread", "-Wall", "-Wextra", "-Werror",
         "-Wno-unused-parameter", "-Wno-unused-function", "-Wno-unknown-pragmas"]
GUARD = 4096

POINTEE = {"f32": numpy.float32, "f64": numpy.float64, "bf16": numpy.uint16, "i32": numpy.int32,
           "u32": numpy.uint32, "i64": numpy.int64, "u64": numpy.uint64, "u8": numpy.uint8}
SCALAR = {"f32": (numpy.float32, ctypes.c_float), "f64": (numpy.float64, ctypes.c_double),
          "i32": (numpy.int32, ctypes.c_int32), "u32": (numpy.uint32, ctypes.c_uint32),
          "i64": (numpy.int64, ctypes.c_int64), "u64": (numpy.uint64, ctypes.c_uint64)}


class EmulationError(RuntimeError):
    pass


class LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_bytes", ctypes.c_ulonglong), ("max_dynamic_shared_bytes", ctypes.c_ulonglong)]


def cache_dir():
    """$MINIDL_EMU_CACHE, else ~/.cache/minidl/cuda-emu, else (not writable) the temp directory."""
    chosen = Path(os.environ.get("MINIDL_EMU_CACHE") or Path.home() / ".cache" / "minidl" / "cuda-emu")
    try:
        chosen.mkdir(parents=True, exist_ok=True)
        return chosen
    except OSError:
        return Path(tempfile.gettempdir()) / "minidl-cuda-emu"


def alias(name):
    """A C identifier for a kernel name or template-id ("conv_fwd<Tf32Tile>" -> "conv_fwd_Tf32Tile_")."""
    return re.sub(r"\W", "_", name) + "_" + hashlib.sha1(name.encode()).hexdigest()[:6]


def translation_unit(path, names):
    exports = "\n".join(f"EMU_EXPORT_KERNEL({alias(n)}, {n})" for n in names)
    return f'#include "cuda_emu.h"\n#include "{Path(path).resolve()}"\nEMU_EXPORT_RUNTIME\n{exports}\n'


def flags(defines):
    return [*FLAGS, *define_options(dict(defines))]


def library_path(path, names, defines=()):
    """Where the library for this source (and what it includes with quotes), header and flag set
    lives (its name is their hash)."""
    digest = hashlib.sha256()
    for part in [translation_unit(path, names).encode(), " ".join([CXX] + flags(defines)).encode()]:
        digest.update(part)
    for source in included_sources(path):  # the source and what it includes
        digest.update(source.read_bytes())
    for header in sorted(EMU_DIR.iterdir()):
        digest.update(header.read_bytes())
    return cache_dir() / f"{Path(path).stem}-{digest.hexdigest()[:20]}.so"


def compile_command(path, names, defines, output):
    """(command, translation unit text): g++ reads the unit from stdin."""
    command = [CXX, *flags(defines), f"-I{EMU_DIR}", "-x", "c++", "-", "-o", str(output)]
    return command, translation_unit(path, names)


def build(jobs, parallel=2):
    """Compile the libraries of several (path, names, defines) not cached yet, `parallel` compilers
    at a time (what a cold cache costs is mostly this). Safe when several processes race."""
    pending = [job for job in jobs if not library_path(*job).exists()]
    while pending:
        batch, pending = pending[:parallel], pending[parallel:]
        running = []
        for path, names, defines in batch:
            target = library_path(path, names, defines)
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(f".{os.getpid()}.tmp")
            command, unit = compile_command(path, names, defines, partial)
            process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
            process.stdin.write(unit)
            process.stdin.close()
            running.append((process, partial, target, path))
        for process, partial, target, path in running:
            error = process.stderr.read()
            if process.wait() != 0:
                partial.unlink(missing_ok=True)
                raise EmulationError(f"g++ could not compile {path} for emulation:\n{error[-6000:]}")
            os.replace(partial, target)


@functools.lru_cache(maxsize=None)
def load(path, names, defines=()):
    """The emulated module of the .cu at `path` exporting the kernels `names` (a tuple), compiled
    with `defines` ((name, value) pairs)."""
    build([(path, names, defines)])
    return EmulatedModule(ctypes.CDLL(str(library_path(path, names, defines))), names)


def load_for_test(path, names):
    """load() for a test module's fixture: skips where there is no C++ compiler, and prints how
    long loading took (compiling, if the cache was cold)."""
    import shutil
    import time

    import pytest
    if shutil.which(CXX) is None:
        pytest.skip(f"{CXX} not found: the CPU emulation needs a C++20 compiler")
    started = time.perf_counter()
    module = load(path, names)
    print(f"\n{Path(path).name}: loaded (compiled if the cache was cold) in {time.perf_counter() - started:.2f} s")
    return module


class EmulatedModule:
    def __init__(self, library, names):
        self.library, self.names = library, names
        library.emu_last_error.restype = ctypes.c_char_p

    def get_function(self, name):
        if name not in self.names:
            raise EmulationError(f"no kernel {name!r} in this module (it has {', '.join(self.names)})")
        return EmulatedKernel(self, name)


class EmulatedKernel:
    """One kernel; called like cupy.RawKernel: kernel(grid, block, args, shared_mem=0)."""

    def __init__(self, module, name):
        self.module, self.name = module, name
        self.max_dynamic_shared_size_bytes = 0  # the opt-in above 48 KiB, as on a GPU
        lib = module.library
        self._launch = getattr(lib, f"emu_launch_{alias(name)}")
        self._launch.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.POINTER(ctypes.c_void_p)]
        signature = getattr(lib, f"emu_signature_{alias(name)}")
        signature.restype = ctypes.c_char_p
        self.parameters = signature().decode().split()

    def __call__(self, grid, block, args, shared_mem=0):
        if len(args) != len(self.parameters):
            raise TypeError(f"{self.name}: {len(args)} arguments for {len(self.parameters)} parameters")
        staging = Staging()
        slots = [self._slot(i, code, arg, staging) for i, (code, arg) in enumerate(zip(self.parameters, args))]
        pointers = (ctypes.c_void_p * len(slots))(*[ctypes.cast(ctypes.pointer(s), ctypes.c_void_p) for s in slots])
        config = LaunchConfig(_dim3(grid), _dim3(block), int(shared_mem), int(self.max_dynamic_shared_size_bytes))
        status = self._launch(ctypes.byref(config), pointers)
        if status != 0:
            raise EmulationError(f"{self.name}: {self.module.library.emu_last_error().decode()}")
        staging.finish(self.name)

    def _slot(self, index, code, arg, staging):
        where = f"{self.name}: argument {index} ({code})"
        if code.endswith("*"):
            if isinstance(arg, numpy.uint64) and arg == 0:
                return ctypes.c_void_p(0)
            if not isinstance(arg, numpy.ndarray):
                raise TypeError(f"{where}: expected an array or numpy.uint64(0), got {type(arg).__name__}")
            if arg.dtype != POINTEE[code[:-1]]:
                raise TypeError(f"{where}: dtype {arg.dtype} does not match the parameter type")
            if not arg.flags.c_contiguous:
                raise TypeError(f"{where}: the array is not C-contiguous")
            return ctypes.c_void_p(staging.address(arg))
        numpy_type, c_type = SCALAR[code]
        if type(arg) is not numpy_type:
            raise TypeError(f"{where}: expected {numpy_type.__name__}, got {type(arg).__name__} "
                            "(CuPy passes Python scalars as 64-bit values)")
        return c_type(arg.item())


def _dim3(dims):
    dims = tuple(int(d) for d in (dims if isinstance(dims, tuple) else (dims,)))
    return (ctypes.c_uint * 3)(*(dims + (1,) * (3 - len(dims))))


class Staging:
    """Copies of the argument arrays between guard bytes, copied back after the launch. As with
    CuPy, an allocation starts 256-byte aligned and a view keeps its offset into it, so the
    kernel sees the alignment it would see on a GPU."""

    def __init__(self):
        self.copies = {}  # base address -> (array, raw buffer, offset)

    def address(self, array):
        start = array.ctypes.data
        if start in self.copies:
            return self._data_address(start)
        for other, raw, offset in self.copies.values():
            if _overlap(array, other):
                raise TypeError("two arguments overlap without being the same array")
        raw = numpy.full(array.nbytes + 2 * GUARD + 256, 0xFF, dtype=numpy.uint8)
        offset = GUARD + (_offset_in_allocation(array) - raw.ctypes.data - GUARD) % 256
        raw[offset:offset + array.nbytes] = array.reshape(-1).view(numpy.uint8)
        self.copies[start] = (array, raw, offset)
        return self._data_address(start)

    def _data_address(self, start):
        _, raw, offset = self.copies[start]
        return raw.ctypes.data + offset

    def finish(self, name):
        for array, raw, offset in self.copies.values():
            end = offset + array.nbytes
            if (raw[:offset] != 0xFF).any() or (raw[end:] != 0xFF).any():
                raise EmulationError(f"{name}: wrote outside an argument array of shape {array.shape}")
            array.reshape(-1).view(numpy.uint8)[...] = raw[offset:end]


def _offset_in_allocation(array):
    owner = array
    while isinstance(owner.base, numpy.ndarray):
        owner = owner.base
    return array.ctypes.data - owner.ctypes.data


def _overlap(a, b):
    a0, b0 = a.ctypes.data, b.ctypes.data
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes
