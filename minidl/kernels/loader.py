"""Where the CUDA sources are, and how a family of kernels becomes a loaded module.

The sources live in the repository's top-level `kernels/` folder. An installed wheel carries
them as the package `minidl.cuda_sources` (pyproject maps that package onto `kernels/`); a
checkout run without installing (PYTHONPATH) finds them beside the `minidl` package. Either
way `source_path(family)` is kernels/<family>.cu.

Every constant that both a launcher and its kernel need (threads per block, tile sizes) is
written once, in the launcher module, and reaches the compiler as a -D define or a template
argument: `compile_options(defines)` are the NVRTC options for one family. On a GPU
`load_rawmodule` compiles a family once per process for the device's architecture (CuPy also
caches the binary on disk); tests/kernels compiles the same sources with nvcc and g++ (the CPU
emulator) from the same options.
"""
import functools
import importlib.util
import os
from pathlib import Path

CHECKOUT_SOURCES = Path(__file__).resolve().parents[2] / "kernels"


def source_dir():
    """The folder holding kernels/*.cu: the installed package data, else the checkout's."""
    spec = importlib.util.find_spec("minidl.cuda_sources")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if any(Path(location).glob("*.cu")):
                return Path(location)
    return CHECKOUT_SOURCES


def source_path(family):
    path = source_dir() / f"{family}.cu"
    if not path.exists():
        raise FileNotFoundError(f"the CUDA source {path} is missing: reinstall minidl (its wheel carries "
                                "kernels/*.cu as the package minidl.cuda_sources)")
    return path


def cuda_include_dir():
    """A directory holding CUDA's headers (mma.h): NVRTC needs it to compile conv.cu."""
    candidates = [os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    try:
        import cupy
        candidates.append(cupy.cuda.get_cuda_path() or "")
    except ImportError:
        pass
    for wheel in ("nvidia.cu13", "nvidia.cuda_runtime"):  # the headers pip wheels carry
        try:
            spec = importlib.util.find_spec(wheel)
        except ImportError:
            spec = None
        if spec and spec.submodule_search_locations:
            candidates.append(list(spec.submodule_search_locations)[0])
    for root in candidates:
        if root and (Path(root) / "include" / "mma.h").exists():
            return str(Path(root) / "include")
    return None


def define_options(defines):
    """-DNAME=VALUE for each of a family's constants, in a fixed order."""
    return tuple(f"-D{name}={value}" for name, value in sorted(defines.items()))


def compile_options(defines):
    """NVRTC options for a family with these constants (CuPy adds -arch from the device); the
    sources' folder is on the include path for the headers they share."""
    include = cuda_include_dir()
    return ("--std=c++17", f"-I{source_dir()}", *((f"-I{include}",) if include else ()), *define_options(defines))


@functools.lru_cache(maxsize=None)
def load_rawmodule(family, names, defines):
    """kernels/<family>.cu as a cupy.RawModule exporting `names` (CuPy name expressions), compiled
    once per process for this GPU. `defines` is a tuple of (name, value) pairs."""
    import cupy
    return cupy.RawModule(code=source_path(family).read_text(), options=compile_options(dict(defines)),
                          name_expressions=names)
