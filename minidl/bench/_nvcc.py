"""One kernel source through nvcc for sm_90: the cubin and ptxas's resource report per kernel.

The source is compiled as a small translation unit that includes it and takes the address of
every kernel name expression (templates included), which instantiates the templates the way
NVRTC's name expressions do. Shared by the SASS audit (minidl.bench.sass) and the compile
checks (tests/kernels/nvcc_check.py).
"""
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ARCH = "sm_90"
FLAGS = ("-cubin", "-Xptxas", "-v")


def arch_flag(arch):
    """sm_90a (wgmma, setmaxnreg) needs its own virtual architecture, compute_90a."""
    return f"-gencode=arch=compute_{arch[3:]},code={arch}" if arch.endswith("a") else f"-arch={arch}"


def find_nvcc():
    """nvcc on PATH, else in $CUDA_PATH or /usr/local/cuda; None where there is none."""
    candidates = [shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_PATH", ""), "bin", "nvcc"),
                  "/usr/local/cuda/bin/nvcc"]
    return next((c for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def translation_unit(path, names):
    addresses = ", ".join(f"(void*)&{n}" for n in names)
    return f'#include "{Path(path).resolve()}"\n' + (f"void* minidl_kernel_addresses[] = {{{addresses}}};\n" if names else "")


def demangle(symbols):
    """{mangled: readable name without return type and parameters}; mangled names where c++filt is missing."""
    filt = shutil.which("c++filt")
    if not filt or not symbols:
        return dict(zip(symbols, symbols))
    out = subprocess.run([filt], input="\n".join(symbols), capture_output=True, text=True).stdout.splitlines()
    readable = [re.sub(r"^void ", "", line).split("(")[0] for line in out]
    return dict(zip(symbols, readable))


def parse_ptxas(log):
    """ptxas -v output -> {mangled name: resources}."""
    kernels, current = {}, None
    for line in log.splitlines():
        entry = re.search(r"Compiling entry function '([^']+)'", line)
        if entry:
            current = kernels.setdefault(entry.group(1), {"smem_bytes": 0})
            continue
        if current is None:
            continue
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if frame:
            current.update(stack_bytes=int(frame.group(1)), spill_store_bytes=int(frame.group(2)),
                           spill_load_bytes=int(frame.group(3)))
        used = re.search(r"Used (\d+) registers", line)
        if used:
            current["registers"] = int(used.group(1))
            barriers = re.search(r"used (\d+) barriers", line)
            smem = re.search(r"(\d+) bytes smem", line)
            current["barriers"] = int(barriers.group(1)) if barriers else 0
            current["smem_bytes"] = int(smem.group(1)) if smem else 0
    return kernels


@dataclass
class Compiled:
    returncode: int
    log: str                                       # nvcc's and ptxas's output
    cubin: bytes = b""                             # empty where nvcc failed
    names: dict = field(default_factory=dict)      # mangled -> readable kernel name
    resources: dict = field(default_factory=dict)  # readable kernel name -> ptxas -v report


def compile_cubin(path, names, options=(), nvcc=None, arch=ARCH):
    """`path` (a .cu) compiled for sm_90 with the kernel name expressions `names` instantiated and
    the extra nvcc `options` (-D, -I, -std, ...); nvcc is found when not given."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("no nvcc found (PATH, $CUDA_PATH/bin, /usr/local/cuda/bin)")
    with tempfile.TemporaryDirectory() as tmp:
        unit, cubin = Path(tmp) / "unit.cu", Path(tmp) / "unit.cubin"
        unit.write_text(translation_unit(path, names))
        result = subprocess.run([nvcc, arch_flag(arch), *FLAGS, *options, "-o", str(cubin), str(unit)], capture_output=True, text=True)
        binary = cubin.read_bytes() if result.returncode == 0 else b""
    log = result.stdout + result.stderr
    parsed = parse_ptxas(log)
    readable = demangle(list(parsed))
    return Compiled(result.returncode, log, binary, readable, {readable[k]: v for k, v in parsed.items()})
