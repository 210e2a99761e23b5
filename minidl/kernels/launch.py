"""What every kernel launcher shares: the function cache, argument types, grids.

`Launcher(load, multiprocessors)` launches kernels through `load(family).get_function(name)`,
where `load` returns an object with CuPy's RawModule interface: on a GPU a RawModule compiled
once per process (minidl.kernels.loader), in tests/kernels a CPU emulator of the same
interface, so every line of the launchers also runs in CI, on NumPy arrays.

Arguments go with exact C types: numpy.int32 / float32 (CuPy would pass a Python int as 64
bits) and `NULL` for a missing pointer (CuPy would turn None into a bad pointer).
"""
import numpy

from minidl.backend import BF16
from minidl.intmath import ceil_div
from minidl.kernels import loader

NULL = numpy.uint64(0)  # a null pointer argument
KERNEL_DTYPES = (numpy.float32, BF16)  # what the kernels take: float32 data, or bf16 bits
DEFAULT_SHARED_LIMIT = 48 * 1024  # dynamic shared memory a kernel may use without opting in


def cxx_type(dtype):
    """The C++ element type the kernels take for a data type: float, or __nv_bfloat16 for BF16 bits."""
    return "__nv_bfloat16" if numpy.dtype(dtype) == BF16 else "float"


def data_address(array):
    return array.data.ptr if hasattr(array.data, "ptr") else array.ctypes.data


def i32(*values):
    return tuple(numpy.int32(v) for v in values)


def pointer(array):
    """The array, or NULL for None."""
    return NULL if array is None else array


def require_float32(*arrays):
    """The kernels without a bf16 version: a bf16 array here is a policy error, not a slow path."""
    for a in arrays:
        if a is not None and a.dtype != numpy.float32:
            raise TypeError(f"this kernel takes float32 data, not {a.dtype} (bf16 is cast back to float32 "
                            "before pooling, the classifier and the loss: minidl.ops.to_float)")


class Launcher:
    def __init__(self, load, multiprocessors, compute_capability=None):
        """`compute_capability`: CuPy's spelling ("90"), None where any family runs (the emulator)."""
        self._load = load
        self.multiprocessors, self.compute_capability = multiprocessors, compute_capability
        self._functions = {}
        self._shared_opt_in = {}  # (family, name) -> dynamic shared memory allowed above 48 KiB

    def launch(self, family, name, grid, block, args, shared_mem=0):
        key = (family, name)
        function = self._functions.get(key)
        if function is None:
            function = self._functions[key] = self._load(family).get_function(name)
        if shared_mem > self._shared_opt_in.get(key, DEFAULT_SHARED_LIMIT):  # the opt-in, once:
            function.max_dynamic_shared_size_bytes = shared_mem  # reading the attribute is a driver call
            self._shared_opt_in[key] = shared_mem
        function(grid, block, args, shared_mem=shared_mem)

    def unavailable(self, arch):
        """Why this device cannot run a family built for `arch` (loader.unavailable), or None."""
        return loader.unavailable(arch, self.compute_capability)

    def elementwise_grid(self, count, threads):
        """Blocks of `threads` for a grid-stride loop over `count` elements: enough to fill the
        GPU, never more than there are elements."""
        return (max(1, min(ceil_div(count, threads), 32 * self.multiprocessors)),)
