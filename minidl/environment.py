"""Every MINIDL_* environment variable: declared once, read only here, recorded with the run.

Each `Variable` has its name, what it means, its default and how its text is parsed; `value(name)`
reads and parses it at the moment of the call (tests and launchers set variables before the
module that needs one asks), and a value that does not parse is a UserError naming the variable
and the fix. `record()` gives every variable's effective value, which the trainer writes into
config.json beside the flags: a run's record says what it computed with.
"""
import os
from dataclasses import dataclass
from pathlib import Path

from minidl.errors import UserError


@dataclass(frozen=True)
class Variable:
    name: str
    help: str
    default: object
    parse: object  # text -> value, raising ValueError with the accepted forms


def _choice(*options):
    def parse(text):
        if text.lower() not in options:
            raise ValueError(f"one of {', '.join(options)}")
        return text.lower()
    return parse


def _switch(text):
    if text not in ("0", "1"):
        raise ValueError("0 or 1")
    return text == "1"


def _module_function(text):
    module, _, function = text.partition(":")
    if not module or not function.isidentifier():
        raise ValueError("module:function (a callable returning the kernels and their array type)")
    return module, function


def _positive_int(text):
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError("a positive integer")
    return int(text)


VARIABLES = {v.name: v for v in (
    Variable("MINIDL_DEVICE", "cpu or gpu: the array module (default: CuPy where it sees a GPU, else NumPy)",
             None, _choice("cpu", "gpu")),
    Variable("MINIDL_KERNELS", "0 keeps CuPy arrays on the reference ops instead of the CUDA kernels", True, _switch),
    Variable("MINIDL_TF32", "0 keeps float32 convolutions in exact fp32 instead of TF32 tensor cores", True, _switch),
    Variable("MINIDL_AUTOTUNE", "0 runs the v1 convolution kernels instead of validating the v2 kernels (the "
             "canary) and timing every validated kernel per shape on first use", True, _switch),
    Variable("MINIDL_CANARY", "0 validates no v2 kernel (no canary, the cached verdicts ignored): the tuner reports "
             "the v2 plans not validated and runs the v1 kernels only", True, _switch),
    Variable("MINIDL_DEVICE_KERNELS", "module:function giving (Kernels, array type) to use in place of the GPU's "
             "kernels (the CPU emulator of tests/kernels/emulated_device.py: emulated_device:device)", None,
             _module_function),
    Variable("MINIDL_NUM_THREADS", "CPU threads of the ops (default: the cores this process may use)", None,
             _positive_int),
    Variable("MINIDL_CACHE", "where the embedded dataset and the autotuner's validations and choices are kept (default: "
             "~/.cache/minidl)", None, str),
    Variable("MINIDL_RANKS_PER_NODE", "group consecutive ranks by this many as if they were nodes "
             "(default: the real nodes)", None, _positive_int),
    Variable("MINIDL_CUDA_AWARE_MPI", "1 or 0 overrides whether MPI takes device pointers (default: ask MPI)",
             None, _switch),
    Variable("MINIDL_BENCH_UNSET", "set by `minidl.bench step` for its restarted process: the tuning "
             "variables it unset", None, lambda text: text.split(",")),
)}


def value(name):
    """The parsed value of variable `name`, or its default where it is unset or empty."""
    variable = VARIABLES[name]
    text = os.environ.get(name, "").strip()
    if not text:
        return variable.default
    try:
        return variable.parse(text)
    except ValueError as error:
        raise UserError(f"{name}={text!r} is not valid: set it to {error} ({variable.help}), or unset it") from None


def record():
    """{name: effective value} of every variable, for config.json."""
    return {name: value(name) for name in VARIABLES}


def cache_dir():
    """MINIDL_CACHE, else ~/.cache/minidl."""
    return value("MINIDL_CACHE") or str(Path.home() / ".cache" / "minidl")
