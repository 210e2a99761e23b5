"""Finished runs kept in one JSON-lines file that git carries from machine to machine.

The run folders under OUTPUT/runs are lost with the machine; a store (`--store`) is not. Each
line is one finished run's result (its row, seed, settings, errors, curves and wall time) with
the BLAS kernel that computed it. The study looks a run up here before training it and appends
every run it finishes, so a study spread over several sessions resumes where the last one
stopped. A run is found only under the same row, seed, settings and kernel: another kernel
rounds differently, so its run is another measurement, not the same one.
"""
import functools
import json
from pathlib import Path

from minidl.errors import UserError
from minidl.fileio import append_json_line

CPU_INFO = Path("/proc/cpuinfo")


@functools.cache
def blas_kernel():
    """What computes this process's matrix products, as a run's key: the BLAS library, its version
    and the core type whose kernels it chose ('openblas 0.3.31.188.0 Haswell'), as threadpoolctl
    reads them from the loaded library (OPENBLAS_CORETYPE changes the core type)."""
    import numpy  # noqa: F401 (the library threadpoolctl inspects is the one NumPy loads)
    import threadpoolctl
    pools = [pool for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]
    if not pools:
        return "no BLAS library found"
    pool = pools[0]
    return " ".join(str(pool.get(key)) for key in ("internal_api", "version", "architecture"))


@functools.cache
def blas_threads():
    import threadpoolctl
    return next((pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"), None)


def cpuinfo_field(name):
    """The value of /proc/cpuinfo's first line that starts with `name`, or None."""
    try:
        lines = CPU_INFO.read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(name)), None)


@functools.cache
def processor():
    """The CPU's model name, as /proc/cpuinfo gives it (a record says where its run was measured)."""
    return cpuinfo_field("model name") or "unknown"


def cpu_flags():
    """The instruction-set flags of this CPU (/proc/cpuinfo's first "flags" line); empty where unknown."""
    return set((cpuinfo_field("flags") or "").split())


def provenance():
    """The fields a new record gets besides its result: the kernel (part of its key) and, for the reader,
    the BLAS threads and the processor."""
    return {"kernel": blas_kernel(), "blas_threads": blas_threads(), "processor": processor()}


class Store:
    """The records of one store file, read once; `add` appends a line to the file at once (a run
    finished is kept even if the study stops right after); `refresh` reads what other processes
    of the study have appended since."""

    def __init__(self, path):
        self.path = Path(path)
        self.records = read_records(self.path)

    def refresh(self):
        self.records = read_records(self.path, complete_lines_only=True)

    def find(self, row_key, seed, kernel, same_settings):
        """The record of `row_key`, `seed` under `kernel` whose settings pass `same_settings`, or None."""
        return next((record for record in self.records if record["row"] == row_key and record["seed"] == seed
                     and record["kernel"] == kernel and same_settings(record["settings"])), None)

    def add(self, record):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        append_json_line(self.path, record)
        self.records.append(record)


def read_records(path, complete_lines_only=False):
    """The records of the store file `path`; `complete_lines_only`: without a last line another
    process is still appending (no newline yet)."""
    if not path.exists():
        return []
    records = []
    try:
        text = path.read_text()
    except OSError as error:
        raise UserError(f"cannot read the run store {path} ({error.strerror}): give a readable --store") from None
    lines = text.splitlines()
    if complete_lines_only and text and not text.endswith("\n"):
        lines.pop()
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            missing = {"row", "seed", "kernel", "settings", "val_error"} - record.keys()
        except (ValueError, AttributeError) as error:
            missing = error
        if missing:
            raise UserError(f"line {number} of the run store {path} is not a run's record ({missing}): restore the "
                            "file from git (git checkout -- FILE) or delete that line")
        records.append(record)
    return records
