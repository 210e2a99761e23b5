"""What minidl's command lines share: the handler they run in, and an argparse parser whose
mistakes are one line.

`run_command` imports a command's module inside its handler: importing the engine reads the
MINIDL_* variables (MINIDL_DEVICE chooses the array module, MINIDL_NUM_THREADS the thread
pool), so a malformed one is reported like a bad flag. A bad flag raises UserError instead of
printing usage and exiting, so every entry point reports it the way it reports any user error:
`PROG: error: <what and the fix>`, exit code 2.
"""
import argparse
import importlib
import sys

from minidl.errors import UserError


def run_command(prog, target, *args):
    """Import "package.module:function" and return its exit code `function(*args)` (None: 0).
    A UserError is one line on stderr and exit code 2 (under mpiexec, every rank ends: the
    others may wait in a collective); Ctrl-C is exit code 130."""
    module, function = target.split(":")
    try:
        return getattr(importlib.import_module(module), function)(*args) or 0
    except UserError as error:
        sys.stderr.write(f"{prog}: error: {error}\n")
        end_other_ranks(2)
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130


def end_other_ranks(code):
    """Abort the MPI job where this process is one of several ranks. Nothing is imported: where
    mpi4py or the watcher was never loaded (the error came first) there is nothing to end."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and mpi.COMM_WORLD.Get_size() > 1:
        watcher = sys.modules.get("minidl.distributed.watcher")
        if watcher is not None:
            watcher.disarm()  # this rank has said why it ends
        mpi.COMM_WORLD.Abort(code)


class OneLineErrorParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", "on_off", argparse.BooleanOptionalAction)  # --flag / --no-flag

    def error(self, message):
        raise UserError(f"{message} (see --help)")
