"""The installable engine: a wheel built from this checkout and installed NON-editable into a
fresh virtual environment outside it works from another directory — its console scripts, a
short CPU epoch, `minidl-train` under mpiexec — and finds the CUDA sources through the
installed package, where the CPU emulator compiles and runs them.

The fresh environment gets minidl from the wheel alone; its dependencies (NumPy, h5py, mpi4py,
...) are those of this test's environment, reached through a .pth file that lists the
directories without running their .pth files, so the editable install of the checkout stays
invisible there."""
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "kernels"))
import emulator  # noqa: E402
import oracle  # noqa: E402
from minidl import kernels  # noqa: E402
from minidl.backend import BF16  # noqa: E402
from mpi.launch import mpiexec, require_mpi  # noqa: E402

pytestmark = pytest.mark.slow  # builds a wheel and installs it into a fresh environment

TIMEOUT = 300


def run(command, cwd, env=None):
    result = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert result.returncode == 0, f"{command} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # this environment's setuptools where it has one (Python < 3.12 venvs do), else pip fetches it
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", out, REPO], cwd=out)
    return next(out.glob("minidl-*.whl"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """(bin folder, environment variables, a working directory outside the checkout)."""
    root = tmp_path_factory.mktemp("fresh")
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=root)
    python = venv / "bin" / "python"
    # without PYTHONPATH: a checkout on it (with its minidl.egg-info) would count as minidl installed already
    unpathed = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel], cwd=root,
        env=unpathed)
    fresh_site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          cwd=root).stdout.strip())
    ours = [p for p in dict.fromkeys(site.getsitepackages() + [sysconfig.get_paths()["purelib"]]) if Path(p).is_dir()]
    (fresh_site / "dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINIDL_", "PYTHON"))}
    env.update(MINIDL_DEVICE="cpu", MINIDL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MINIDL_CACHE=str(root / "cache"), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               # mpi4py looks for the MPI library of the mpich wheel beside its own prefix, which is ours
               LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(Path(sys.prefix) / "lib"),
                                                             env.get("LD_LIBRARY_PATH")])))
    work = root / "work"
    work.mkdir()
    return venv / "bin", env, work


def test_the_wheel_carries_every_module_and_the_cuda_sources(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "minidl").rglob("*.py")}
    assert modules <= names, f"pyproject's package list misses {sorted(modules - names)}"
    sources = {p.name for p in (REPO / "kernels").iterdir() if p.suffix in (".cu", ".cuh")}
    assert {f"minidl/cuda_sources/{name}" for name in sources} <= names
    machines = {p.relative_to(REPO).as_posix() for p in (REPO / "minidl" / "plan" / "machines").glob("*.json")}
    assert machines and machines <= names, "the simulator's machine files travel with it"
    assert not any(name.startswith(("tests/", "kernels/")) for name in names)


def test_console_scripts_from_another_directory(installed):
    bin_dir, env, work = installed
    located = run([bin_dir / "python", "-c", "import minidl; print(minidl.__file__)"], cwd=work, env=env).stdout
    assert str(REPO) not in located and "site-packages" in located, located
    rows = [json.loads(line) for line in run([bin_dir / "minidl-train", "--recipe", "goyal", "--print-schedule",
                                              "--world-size", "256", "--dataset-size", "1281167"],
                                             cwd=work, env=env).stdout.splitlines()]
    assert len(rows) == 90 and rows[0]["global_batch"] == 8192 and rows[5]["lr"] == pytest.approx(3.2)
    assert "usage" in run([bin_dir / "minidl-prepare-imagenet", "--help"], cwd=work, env=env).stdout
    plan = run([bin_dir / "minidl-plan", "--recipe", "goyal", "--world-size", "16", "--machine", "big_basin"],
               cwd=work, env=env).stdout
    assert "on 16 GPUs of big_basin (2 nodes of 8)" in plan and "time to train" in plan
    result = subprocess.run([bin_dir / "minidl-train", "--epochs", "0"], cwd=work, env=env, capture_output=True,
                            text=True, timeout=TIMEOUT)
    assert result.returncode == 2 and result.stderr.startswith("minidl-train: error: --epochs"), result.stderr


def short_run_flags(data, output):
    return ["--data-path", data, "--model", "resnet20", "-b", "8", "--epochs", "1", "--train-crop-size", "16",
            "--val-crop-size", "16", "--val-resize-size", "16", "--augment", "none", "--output-dir", output]


@pytest.fixture(scope="module")
def tiny_data(installed):
    bin_dir, env, work = installed
    run([bin_dir / "python", "-c", "from minidl.data import make_embedded_dataset; "
         "make_embedded_dataset('tiny', train_per_class=2, val_per_class=1)"], cwd=work, env=env)
    return work / "tiny"


def test_one_cpu_epoch_from_the_installed_wheel(installed, tiny_data):
    bin_dir, env, work = installed
    run([bin_dir / "minidl-train", *short_run_flags(tiny_data, "one")], cwd=work, env=env)
    summary = json.loads((work / "one" / "summary.json").read_text())
    assert summary["epochs"] == 1 and summary["world_size"] == 1
    config = json.loads((work / "one" / "config.json").read_text())
    assert config["environment"]["MINIDL_DEVICE"] == "cpu" and config["environment"]["MINIDL_NUM_THREADS"] == 1


def test_minidl_train_under_mpiexec(installed, tiny_data):
    require_mpi()
    bin_dir, env, work = installed
    run([mpiexec(), "-n", "2", bin_dir / "minidl-train", *short_run_flags(tiny_data, "two")], cwd=work, env=env)
    summary = json.loads((work / "two" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_batch"] == 16


def test_the_installed_kernel_sources_compile_and_run_on_the_emulator(installed):
    if shutil.which(emulator.CXX) is None:
        pytest.skip(f"{emulator.CXX} not found: the CPU emulation of the kernels needs a C++20 compiler")
    bin_dir, env, work = installed
    found = run([bin_dir / "python", "-c", "from minidl.kernels import loader; print(loader.source_path('amp'))"],
                cwd=work, env=env).stdout.strip()
    assert "site-packages" in found and found.endswith("minidl/cuda_sources/amp.cu"), found
    amp = kernels.FAMILIES["amp"]
    module = emulator.load(found, amp.NAMES, tuple(sorted(amp.DEFINES.items())))
    emulated = kernels.Kernels(lambda family: module, 2)
    values = numpy.random.default_rng(0).standard_normal(1000).astype(numpy.float32)
    assert numpy.array_equal(emulated.cast(values, BF16), oracle.to_bf16(values))
