"""Deprecated alias of `minidl.distributed`, kept for one release: import that instead.

The package was renamed because the common Python `.gitignore` template ignores every folder
named `dist/` (build output), which silently dropped the distributed layer from users' commits.
`minidl.dist` and `minidl.dist.<module>` still name the same module objects as before.
"""
import importlib
import sys
import warnings

from minidl.distributed import *  # noqa: F401,F403 (the public names, as before)
from minidl.distributed import __all__  # noqa: F401

warnings.warn("minidl.dist is renamed minidl.distributed; the alias goes away in the next release",
              DeprecationWarning, stacklevel=2)

SUBMODULES = ("allreduce", "comm", "costmodel", "launch", "mpi_transport", "nccl_transport", "reducer",
              "watcher", "world")
for _name in SUBMODULES:  # `import minidl.dist.comm` finds the one module, not a second copy of it
    sys.modules[f"{__name__}.{_name}"] = globals()[_name] = importlib.import_module(f"minidl.distributed.{_name}")
__path__ = []  # a package for the import system, whose submodules are the aliases above
