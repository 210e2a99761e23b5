"""One run of the study, cached: `OUTPUT/runs/<row>-seed<k>/result.json` once it has finished.

A run folder holds the trainer's own outputs (metrics, checkpoints, its printed lines in
train.log) and `settings.json`, what the run was started with. Asking again for a finished run
reads its result; an interrupted one resumes from its last checkpoint; a folder made with other
settings is refused (another --output-dir keeps both). While a process trains a run it holds a
lock on the folder's `claim` file, so that several processes of one machine can share a study's
output folder and store, each training other runs (the lock goes with its process).
"""
import contextlib
import fcntl
import json
from pathlib import Path

from minidl.config import BASE_DEFAULTS, IMAGENET_PROFILE, Config
from minidl.data.embedded import EMBEDDED_CLASSES
from minidl.errors import UserError
from minidl.experiments.large_batch.rows import config_for
from minidl.experiments.large_batch.store import blas_kernel, provenance
from minidl.fileio import write_json_atomic
from minidl.plot import read_jsonl

# Configuration fields that say where things are and how they are loaded, not what a run
# computes: a study may move. Every other field counts, even one that changes no result.
NOT_SETTINGS = ("output_dir", "cache_dir", "data_path", "workers")
MISSING = object()  # a setting one side of a comparison does not have


class Interrupted(Exception):
    """A signal stopped a run after its checkpoint: rerunning the study resumes it."""


class Busy(Exception):
    """Another process is training this run."""


@contextlib.contextmanager
def claimed(run_dir):
    """Hold `run_dir` for this process while it trains there; Busy where another process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "claim", "a") as claim:
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(run_dir) from None
        yield


def as_json(values):
    """`values` as JSON gives them back (tuples become lists), so a record compares with its source."""
    return json.loads(json.dumps(values))


def settings_of(config, design):
    settings = {k: v for k, v in config.to_dict().items() if k not in NOT_SETTINGS}
    return as_json(dict(settings, dataset=design.dataset_name))


def read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"cannot read {path} ({error}): delete that run's folder to run it again") from None


def engine_value(key, value):
    """What the engine trains with for a setting given as `value`: one left unset (None) takes the
    default the engine fills in for a run on image folders, as every run of the study is."""
    return as_json(IMAGENET_PROFILE.get(key, BASE_DEFAULTS.get(key))) if value is None else value


def changed_settings(recorded, settings):
    """The settings in which a run's record differs from `settings`. A setting the record lacks came to
    the engine after the run was made: at its default it computes what the run computed; a setting
    left unset equals the value the engine fills in."""
    defaults = as_json(Config().to_dict())
    return sorted(k for k in settings.keys() | recorded.keys()
                  if engine_value(k, settings.get(k, MISSING))
                  != engine_value(k, recorded.get(k, defaults.get(k, MISSING))))


def check_settings(run_dir, recorded, settings):
    """Refuse a run folder made with other settings."""
    changed = changed_settings(recorded, settings)
    if changed:
        raise UserError(f"{run_dir} was made with other settings ({', '.join(changed)}): give another "
                        "--output-dir, or delete that folder to redo the run")


def prepared(row, seed, design, data, output_dir):
    """The run folder, configuration and settings of `row` with `seed`, the configuration checked."""
    run_dir = Path(output_dir) / "runs" / f"{row.key}-seed{seed}"
    config = config_for(row, seed, design, data, run_dir)
    config.resolved()  # the engine's checks of the configuration, before anything is written
    return run_dir, config, settings_of(config, design)


def finished(row, seed, design, data, output_dir, store=None):
    """Where a finished run of `row` with `seed` is kept, "folder" or "store", and its result; (None, None)
    where it is in neither. A finished folder made with other settings or another kernel is refused."""
    run_dir, _, settings = prepared(row, seed, design, data, output_dir)
    if (run_dir / "result.json").exists():
        result = read_json(run_dir / "result.json")
        check_settings(run_dir, result["settings"], settings)
        check_kernel(run_dir, result)
        return "folder", result
    stored = store and store.find(row.key, seed, blas_kernel(),
                                  lambda recorded: not changed_settings(recorded, settings))
    return ("store", stored) if stored else (None, None)


def run_once(row, seed, design, data, output_dir, store=None):
    """The result of `row` with `seed` (a dict, `cached` true when nothing was trained): from its run
    folder, else from `store` (a Store, or None), else trained now and added to both. Busy where
    another process is training it."""
    cached = cached_result(row, seed, design, data, output_dir, store)
    if cached:
        return cached
    run_dir, config, settings = prepared(row, seed, design, data, output_dir)
    with claimed(run_dir):
        cached = cached_result(row, seed, design, data, output_dir, store)  # finished by another meanwhile
        if cached:
            return cached
        result_path, settings_path = run_dir / "result.json", run_dir / "settings.json"
        if settings_path.exists():
            check_settings(run_dir, read_json(settings_path), settings)
        write_json_atomic(settings_path, settings)
        diverged = train_quietly(config, run_dir / "train.log")
        result = result_of(row, seed, design, settings, run_dir, diverged)
        keep(store, result)  # before result.json: a process that finds the folder finished finds the record
        write_json_atomic(result_path, result)
    return dict(result, cached=False)


def cached_result(row, seed, design, data, output_dir, store):
    where, result = finished(row, seed, design, data, output_dir, store)
    if where == "folder":
        keep(store, result)
    return dict(result, cached=True) if result else None


def check_kernel(run_dir, result):
    """Refuse a finished run folder of another BLAS kernel: its errors are not this kernel's."""
    recorded = result.get("kernel", blas_kernel())  # a folder from before kernels were recorded: this one's
    if recorded != blas_kernel():
        raise UserError(f"{run_dir} was computed by {recorded}, this process by {blas_kernel()}: give another "
                        "--output-dir, or the --blas-coretype it was made with")


def keep(store, result):
    """Add a finished run to the store unless it is there (a folder finished before the store was given,
    or a run another process added)."""
    if store is None:
        return
    store.refresh()
    if not store.find(result["row"], result["seed"], blas_kernel(), lambda recorded: recorded == result["settings"]):
        store.add({**provenance(), **result})


def train_quietly(config, log_path):
    """Train, the trainer's lines and bars going to `log_path`; returns why it diverged, or None."""
    from minidl.trainer import TrainingStopped, run
    with open(log_path, "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            summary = run(config)
        except TrainingStopped as stopped:  # a non-finite loss: the run's outcome, not the study's failure
            return str(stopped)
    if summary.get("preempted"):
        raise Interrupted(f"stopped at iteration {summary['iteration']}, checkpoint {summary['checkpoint']}")
    return None


def result_of(row, seed, design, settings, run_dir, diverged):
    """Per-epoch curves and the final validation error (%); a diverged run counts at chance."""
    metrics = read_jsonl(run_dir / "metrics.jsonl", "epoch") if (run_dir / "metrics.jsonl").exists() else []
    val_error = [100 * (1 - m["val_top1"]) for m in metrics]
    final = 100 * (1 - 1 / len(EMBEDDED_CLASSES)) if diverged else val_error[-1]
    wall = sum(m["seconds"] for m in metrics)
    return {"row": row.key, "seed": seed, **provenance(), "settings": settings, "val_error": final,
            "diverged": diverged, "steps": row.steps(design), "wall_seconds": wall, "val_error_curve": val_error,
            "train_loss_curve": [m["train_loss"] for m in metrics]}
