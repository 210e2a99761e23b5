"""Bad input that used to escape as a traceback, for every command line (train.py, minidl-train,
python -m minidl.train, python -m minidl.bench, the study): one line on stderr naming the
problem and the fix, exit code 2, nothing already written lost.

- a malformed MINIDL_* variable, read while the engine is imported (before any flag is parsed:
  minidl.cli.run_command imports each command inside its handler);
- an OS error on a path the user gave: an output folder that is a file, inside a file, or not
  writable; an output file that is a folder; a checkpoint that is a folder; data that is a file.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minidl import train
from minidl.bench import __main__ as bench
from minidl.experiments.large_batch import cli as study
from mpi.launch import mpiexec, require_mpi

REPO = Path(__file__).resolve().parents[2]
NUM_THREADS = ("MINIDL_NUM_THREADS", "zero", "MINIDL_NUM_THREADS='zero' is not valid: set it to a positive integer")
DEVICE = ("MINIDL_DEVICE", "tpu", "MINIDL_DEVICE='tpu' is not valid: set it to one of cpu, gpu")
MINIDL_TRAIN = shutil.which("minidl-train", path=str(Path(sys.executable).parent))


def run(command, variable, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIDL_")}
    env[variable[0]] = variable[1]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def assert_one_line(stderr, prog, *words):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("command, prog, variable", [
    ([sys.executable, str(REPO / "train.py"), "--epochs", "1"], "train.py", NUM_THREADS),
    ([sys.executable, str(REPO / "train.py"), "--help"], "train.py", DEVICE),
    ([sys.executable, "-m", "minidl.train"], "python -m minidl.train", DEVICE),
    ([MINIDL_TRAIN], "minidl-train", NUM_THREADS),
    ([sys.executable, "-m", "minidl.bench", "step"], "minidl.bench step", NUM_THREADS),
    ([sys.executable, "-m", "minidl.bench", "allreduce"], "minidl.bench allreduce", DEVICE),
    ([sys.executable, "-m", "minidl.experiments.large_batch", "--help"], "python -m minidl.experiments.large_batch",
     DEVICE),
], ids=["train.py", "train.py --help", "-m minidl.train", "minidl-train", "bench step", "bench allreduce", "study"])
def test_a_malformed_variable_read_at_import_is_one_line(command, prog, variable, tmp_path):
    if command[0] is None:
        pytest.skip("minidl-train is not installed beside this Python")
    result = run(command, variable, tmp_path)
    assert result.returncode == 2, result.stderr
    assert_one_line(result.stderr, prog, variable[2], "or unset it")
    assert list(tmp_path.iterdir()) == []  # nothing made


@pytest.mark.slow
@pytest.mark.parametrize("python", [["-m", "mpi4py"], []], ids=["MPI joined", "before MPI"])
def test_a_malformed_variable_under_mpiexec_ends_every_rank_with_one_line_for_the_job(python, tmp_path):
    require_mpi()
    result = run([mpiexec(), "-n", "2", sys.executable, *python, str(REPO / "train.py")], DEVICE, tmp_path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("train.py: error: MINIDL_DEVICE='tpu' is not valid"), lines


@pytest.fixture
def paths(tmp_path):
    """A file, a folder, and a finished run's log that must survive a refused start."""
    (tmp_path / "file").write_text("keep me\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"epoch": 1}\n')
    return tmp_path


def train_error(capsys, *argv):
    code = train.main([*map(str, argv)], prog="train.py")
    return code, capsys.readouterr().err


@pytest.mark.parametrize("flags, words", [
    (["--output-dir", "{file}"], ["--output-dir", "is a file: choose a folder you can write to"]),
    (["--output-dir", "{file}/run"], ["--output-dir", "is inside", "which is a file"]),
    (["--output-dir", "{run}", "--trace-steps", "1:2", "--trace", "{folder}"],
     ["--trace", "is a folder: choose a file you can write to"]),
    (["--output-dir", "{run}", "--trace-steps", "1:2", "--trace", "{file}/trace.json"], ["--trace", "which is a file"]),
    (["--output-dir", "{run}", "--cache-dir", "{file}"], ["--cache-dir", "is a file"]),
    (["--output-dir", "{run}", "--data-path", "{file}"], ["data path", "is a file, not a folder"]),
    (["--output-dir", "{run}", "--resume", "{folder}"], ["checkpoint", "is a folder: pass the path of a checkpoint"]),
], ids=["output-dir file", "output-dir inside a file", "trace folder", "trace inside a file", "cache-dir file",
        "data-path file", "resume folder"])
def test_a_path_that_cannot_be_used_is_one_line_and_nothing_is_lost(paths, capsys, flags, words):
    argv = [flag.format(file=paths / "file", folder=paths / "folder", run=paths / "run") for flag in flags]
    code, err = train_error(capsys, *argv, "--epochs", "1")
    assert code == 2, err
    assert_one_line(err, "train.py", *words)
    assert (paths / "file").read_text() == "keep me\n"
    assert (paths / "run" / "metrics.jsonl").read_text() == '{"epoch": 1}\n'
    assert sorted(p.name for p in paths.iterdir()) == ["file", "folder", "run"]
    assert list((paths / "folder").iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_an_unwritable_output_dir_is_one_line(paths, capsys):
    (paths / "folder").chmod(0o500)
    try:
        code, err = train_error(capsys, "--output-dir", paths / "folder", "--epochs", "1")
    finally:
        (paths / "folder").chmod(0o700)
    assert code == 2
    assert_one_line(err, "train.py", "--output-dir", "cannot be written (Permission denied)")


def test_the_probe_sees_what_root_cannot_write(capsys):
    """os.access says yes to root everywhere; the probe file tells the truth (/sys takes none)."""
    if not Path("/sys").is_dir():
        pytest.skip("no /sys")
    code, err = train_error(capsys, "--output-dir", "/sys/minidl-test-output", "--epochs", "1")
    assert code == 2
    assert_one_line(err, "train.py", "--output-dir /sys/minidl-test-output cannot be written")


@pytest.mark.parametrize("argv, words", [
    (["allreduce", "--json", "{folder}"], ["minidl.bench allreduce", "--json", "is a folder"]),
    (["sass", "--json", "{file}/rows.json"], ["minidl.bench sass", "--json", "which is a file"]),
    (["loader", "--cache-dir", "{file}"], ["minidl.bench loader", "--cache-dir", "is a file"]),
])
def test_bench_paths_are_checked_before_measuring(paths, capsys, argv, words):
    argv = [arg.format(file=paths / "file", folder=paths / "folder") for arg in argv]
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert_one_line(err, words[0], *words[1:])
    assert (paths / "file").read_text() == "keep me\n" and list((paths / "folder").iterdir()) == []


def test_study_cache_dir_that_is_a_file_is_one_line(paths, capsys):
    assert study.main(["--output-dir", str(paths / "run"), "--cache-dir", str(paths / "file")]) == 2
    assert_one_line(capsys.readouterr().err, study.PROG, "--cache-dir", "is a file")
    assert (paths / "file").read_text() == "keep me\n"
