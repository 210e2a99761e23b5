"""Where the CUDA sources are, and how a family of kernels becomes a loaded module:
`source_path(family)` is kernels/<family>.cu, from a checkout or the installed wheel
(`minidl.cuda_sources`). `compile_options(defines)` are a family's NVRTC options: every constant
a launcher shares with its kernel is written once, in the launcher, and reaches the compiler as
a define, plus a hash of the .cu and its headers so CuPy's disk cache compiles anew after any
edit. A family may declare the architecture it needs (`ARCH`, e.g. "sm_90a" for wgmma and
setmaxnreg): `arch_options` spells it for NVRTC, `unavailable` says why a device cannot run it.
On a GPU `load_rawmodule` compiles a family once per process.

Details: docs/kernels.md, "minidl/kernels/loader.py".
"""
import functools
import hashlib
import importlib.util
import os
import re
from pathlib import Path

CHECKOUT_SOURCES = Path(__file__).resolve().parents[2] / "kernels"
QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


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


def included_sources(path):
    """`path` and every file it includes with quotes, recursively, each once, in the order first
    included: found next to the including file, else in source_dir() (the -I of compile_options)."""
    found, pending = [], [Path(path).resolve()]
    while pending:
        source = pending.pop(0)
        if source in found:
            continue
        found.append(source)
        for name in QUOTED_INCLUDE.findall(source.read_text()):
            beside = source.parent / name
            included = beside if beside.is_file() else source_dir() / name
            if included.is_file():
                pending.append(included.resolve())
    return found


def _digest(paths):
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def sources_hash(family):
    """A hash of kernels/<family>.cu and every header it includes: what its compiled kernels depend on."""
    return _digest(included_sources(source_path(family)))


LAUNCHERS = Path(__file__).resolve().parent


def all_sources_hash():
    """A hash of every kernels/*.cu and *.cuh and of the launchers minidl/kernels/*.py (grids,
    tiles, shared-memory sizes are theirs): changes with any kernel source or launch."""
    folder = source_dir()
    return _digest([*sorted([*folder.glob("*.cu"), *folder.glob("*.cuh")]), *sorted(LAUNCHERS.glob("*.py"))])


def define_options(defines):
    """-DNAME=VALUE for each of a family's constants, in a fixed order."""
    return tuple(f"-D{name}={value}" for name, value in sorted(defines.items()))


SM_90A = "sm_90a"  # Hopper's arch-specific features (wgmma, setmaxnreg): runs on compute capability 9.0 only
ARCH_SPECIFIC = re.compile(r"sm_(\d+)a")


def required_arch(module):
    """The architecture a launcher module's family needs (its ARCH), or None: any CuPy compiles for."""
    return getattr(module, "ARCH", None)


def arch_options(arch):
    """NVRTC's spelling of `arch` (none for None). CuPy appends its own -arch=sm_XY of the device
    after the options; NVRTC keeps the arch-specific sm_XYa given first when the numbers agree
    (tests/kernels/test_nvrtc.py), and `unavailable` keeps every other device from loading it."""
    return (f"--gpu-architecture={arch}",) if arch else ()


def unavailable(arch, compute_capability):
    """Why a family built for `arch` cannot run on a device of `compute_capability` (CuPy's
    spelling, "90" for 9.0), or None where it can. None for a capability: the CPU emulator, which
    runs every family. Arch-specific code (sm_90a) runs on its own capability only, not later ones."""
    if arch is None or compute_capability is None:
        return None
    specific = ARCH_SPECIFIC.fullmatch(arch)
    number = specific.group(1) if specific else arch.removeprefix("sm_")
    if specific and str(compute_capability) != number or int(compute_capability) < int(number):
        capability = f"{int(compute_capability) // 10}.{int(compute_capability) % 10}"
        return (f"needs {arch} (compute capability {int(number) // 10}.{int(number) % 10}"
                f"{' exactly' if specific else ' or later'}); this GPU is {capability}")
    return None


def compile_options(defines, family=None, arch=None):
    """NVRTC options for a family with these constants (CuPy adds -arch from the device; `arch`: the
    one the family needs, see arch_options); the sources' folder is on the include path for the
    headers they share. With `family`, the hash of its sources too (-DMINIDL_SOURCES_HASH, for
    CuPy's cache key: see above)."""
    include = cuda_include_dir()
    sources = (f"-DMINIDL_SOURCES_HASH={sources_hash(family)}",) if family else ()
    return ("--std=c++17", *arch_options(arch), f"-I{source_dir()}", *((f"-I{include}",) if include else ()),
            *define_options(defines), *sources)


@functools.lru_cache(maxsize=None)
def load_rawmodule(family, names, defines, arch=None):
    """kernels/<family>.cu as a cupy.RawModule exporting `names` (CuPy name expressions), compiled
    once per process for this GPU (and `arch`, where the family needs one). `defines` is a tuple
    of (name, value) pairs. A GPU that cannot run `arch` raises, naming it."""
    import cupy
    why_not = unavailable(arch, cupy.cuda.Device().compute_capability)
    if why_not:
        raise RuntimeError(f"kernels/{family}.cu {why_not}: its plans are not for this GPU")
    return cupy.RawModule(code=source_path(family).read_text(), options=compile_options(dict(defines), family, arch),
                          name_expressions=names)
