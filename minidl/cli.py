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
import time

from minidl.errors import UserError
from minidl.launchers import launcher_rank


def run_command(prog, target, *args):
    """Import "package.module:function" and return its exit code `function(*args)` (None: 0).
    A UserError is one line on stderr for the whole job and exit code 2 (under mpiexec or srun,
    every rank ends: the others may wait in a collective); Ctrl-C is exit code 130."""
    module, function = target.split(":")
    try:
        return getattr(importlib.import_module(module), function)(*args) or 0
    except UserError as error:
        report_once(f"{prog}: error: {error}\n")
        end_other_ranks(2)
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return 130


# How long a rank other than 0 waits for rank 0 to report the same mistake and end the job
RANK_ZERO_GRACE_SECONDS = 5.0


def joined_mpi():
    """The mpi4py.MPI module where this process is one of several ranks of an MPI job, else None.
    Nothing is imported: where mpi4py was never loaded (the error came first) there is no job to join."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi if mpi is not None and mpi.Is_initialized() and mpi.COMM_WORLD.Get_size() > 1 else None


def disarm_watcher():
    """This rank says itself why it ends: its watcher (minidl.distributed.watcher) stays quiet."""
    watcher = sys.modules.get("minidl.distributed.watcher")
    if watcher is not None:
        watcher.disarm()


def report_once(line):
    """Write a user error's line once for the job, not once per rank. Every rank meets a mistake in a
    flag, a variable or the launch alike, so rank 0 reports it. Before MPI joins them (a bad flag, or
    srun's tasks that MPI never joins) the other ranks leave it to rank 0; after, they give rank 0 a
    few seconds to report it and end the job (which ends them too), and report it themselves where it
    did not (a mistake found on some ranks only)."""
    mpi = joined_mpi()
    rank = mpi.COMM_WORLD.Get_rank() if mpi else launcher_rank()
    if rank > 0:
        if mpi is None:
            return
        disarm_watcher()
        time.sleep(RANK_ZERO_GRACE_SECONDS)
    sys.stderr.write(line)


def end_other_ranks(code):
    """Abort the MPI job where this process is one of several ranks."""
    mpi = joined_mpi()
    if mpi is not None:
        disarm_watcher()
        mpi.COMM_WORLD.Abort(code)


class OneLineErrorParser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", "on_off", argparse.BooleanOptionalAction)  # --flag / --no-flag

    def error(self, message):
        raise UserError(f"{message} (see --help)")
