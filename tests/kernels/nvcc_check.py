"""Compile kernels/*.cu with nvcc for sm_90 and read ptxas's resource report per kernel.

    python tests/kernels/nvcc_check.py [--json FILE]     # a table, or JSON, of every kernel

Each family is compiled as a small translation unit that includes the .cu and takes the
address of every kernel minidl.kernels launches (each family's NAMES), which instantiates the
templates, with the family's constants as -D options (its DEFINES).
Warnings are errors. The report per kernel: registers, spill stores and loads (bytes), stack
frame, static shared memory (dynamic shared memory is sized at launch: minidl.kernels), barriers.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from minidl.kernels import FAMILIES, loader  # noqa: E402

ARCH = "sm_90"
FLAGS = ["-std=c++17", f"-arch={ARCH}", "-cubin", "-Xptxas", "-v", "--Werror", "all-warnings"]
SELFTEST = Path(__file__).resolve().parent / "emu_selftest.cu"


def find_nvcc():
    """nvcc on PATH, else in $CUDA_PATH or /usr/local/cuda; None where there is none."""
    candidates = [shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_PATH", ""), "bin", "nvcc"),
                  "/usr/local/cuda/bin/nvcc"]
    return next((c for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def sources():
    """(family, path, kernel name expressions, -D options) of every source nvcc must compile."""
    return [(f, loader.source_path(f), m.NAMES, loader.define_options(m.DEFINES)) for f, m in FAMILIES.items()] + \
        [("emu_selftest", SELFTEST, (), ())]


def translation_unit(path, names):
    addresses = ", ".join(f"(void*)&{n}" for n in names)
    return f'#include "{path}"\n' + (f"void* minidl_kernel_addresses[] = {{{addresses}}};\n" if names else "")


def demangle(symbols):
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


def compile_family(nvcc, path, names, options=()):
    """(returncode, log, {kernel: resources}) for one source."""
    with tempfile.TemporaryDirectory() as tmp:
        unit = Path(tmp) / "unit.cu"
        unit.write_text(translation_unit(path, names))
        result = subprocess.run([nvcc, *FLAGS, *options, "-o", str(Path(tmp) / "unit.cubin"), str(unit)],
                                capture_output=True, text=True)
    log = result.stdout + result.stderr
    parsed = parse_ptxas(log)
    readable = demangle(list(parsed))
    return result.returncode, log, {readable[k]: v for k, v in parsed.items()}


def compile_all(nvcc, parallel=2):
    """{family: (returncode, log, kernels)}, `parallel` compilers at a time."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(parallel) as pool:
        futures = {family: pool.submit(compile_family, nvcc, path, names, options)
                   for family, path, names, options in sources()}
        return {family: future.result() for family, future in futures.items()}


def table(results):
    lines = [f"{'kernel':44} {'regs':>5} {'spill st/ld':>12} {'stack':>6} {'smem':>6}"]
    for family, (_, _, kernels) in results.items():
        for name, r in sorted(kernels.items()):
            spills = f"{r.get('spill_store_bytes', '?')}/{r.get('spill_load_bytes', '?')}"
            lines.append(f"{family + ': ' + name:44} {r.get('registers', '?'):>5} {spills:>12} "
                         f"{r.get('stack_bytes', '?'):>6} {r['smem_bytes']:>6}")
    return "\n".join(lines)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    nvcc = find_nvcc()
    if nvcc is None:
        print("nvcc_check: no nvcc found (PATH, $CUDA_PATH/bin, /usr/local/cuda/bin)", file=sys.stderr)
        return 2
    results = compile_all(nvcc)
    print(table(results))
    failed = [f for f, (code, _, _) in results.items() if code != 0]
    for family in failed:
        print(f"\n{family}: nvcc failed\n{results[family][1]}", file=sys.stderr)
    if args.json:
        report = {"nvcc": nvcc, "arch": ARCH, "failed": failed,
                  "kernels": {f: k for f, (_, _, k) in results.items()}}
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
