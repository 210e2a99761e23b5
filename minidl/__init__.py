"""minidl: a transparent, from-scratch deep learning engine for large-minibatch training.

The names below are imported at first use: importing minidl alone reads no MINIDL_* variable
and chooses no device, so a command line (minidl.cli.run_command) imports the engine inside its
handler and reports a malformed variable as the user error it is."""
import importlib

_HOMES = {"Function": "minidl.autograd", "Tensor": "minidl.autograd", "no_grad": "minidl.autograd",
          "to_numpy": "minidl.backend", "xp": "minidl.backend", "manual_seed": "minidl.nn"}
__all__ = ["Function", "Tensor", "manual_seed", "no_grad", "ops", "to_numpy", "xp"]


def __getattr__(name):
    if name == "ops":
        return importlib.import_module("minidl.ops")
    if name not in _HOMES:
        raise AttributeError(f"module 'minidl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # the next look-up finds it without this function
    return value
