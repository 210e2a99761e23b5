"""Launches recorded instead of run: what a launcher launches for one call, exactly.

`Recorder().load` stands where `minidl.kernels.Kernels` expects its `load(family)` (on a GPU the
compiled RawModule): the launcher's own code computes every grid, block, shared-memory size,
opt-in and argument as it would on a device, and each launch is kept, in order, instead of run.
The arrays the launcher is given may be NumPy arrays of any size: nothing reads or writes them.
"""
from dataclasses import dataclass, field


@dataclass
class Launch:
    family: str
    name: str              # the kernel's name expression (templates included)
    grid: tuple            # three dimensions
    block: tuple
    shared_mem: int        # dynamic shared memory, bytes
    args: tuple            # arrays, and scalars with their NumPy types (numpy.int32, ...)
    shared_opt_in: int = 0  # the dynamic shared-memory limit the launcher raised before it (0: none)


@dataclass
class Recorder:
    launches: list = field(default_factory=list)
    opt_ins: dict = field(default_factory=dict)  # (family, name) -> the limit the launcher set

    def load(self, family):
        return _Module(self, family)


def three(dims):
    dims = tuple(int(d) for d in dims)
    return dims + (1,) * (3 - len(dims))


class _Module:
    def __init__(self, recorder, family):
        self.recorder, self.family = recorder, family

    def get_function(self, name):
        return _Function(self.recorder, self.family, name)


class _Function:
    """A kernel whose calls are recorded; `max_dynamic_shared_size_bytes` is the opt-in CuPy's
    function object takes (a cudaFuncSetAttribute)."""

    def __init__(self, recorder, family, name):
        self.recorder, self.family, self.name = recorder, family, name

    @property
    def max_dynamic_shared_size_bytes(self):
        return self.recorder.opt_ins.get((self.family, self.name), 0)

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value):
        self.recorder.opt_ins[(self.family, self.name)] = int(value)

    def __call__(self, grid, block, args, shared_mem=0):
        self.recorder.launches.append(Launch(self.family, self.name, three(grid), three(block), int(shared_mem),
                                             tuple(args), self.max_dynamic_shared_size_bytes))
