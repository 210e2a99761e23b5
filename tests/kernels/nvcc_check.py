"""Compile kernels/*.cu with nvcc for sm_90 and read ptxas's resource report per kernel.

    python tests/kernels/nvcc_check.py [--json FILE]     # a table, or JSON, of every kernel

Each family is compiled as a small translation unit that includes the .cu and takes the
address of every kernel minidl.kernels launches (each family's NAMES), which instantiates the
templates, with the family's constants as -D options (its DEFINES; minidl.bench._nvcc, shared
with the SASS audit); so are the emulator's selftests. Warnings are
errors. The report per kernel: registers, spill stores and loads (bytes), stack frame, static
shared memory (dynamic shared memory is sized at launch: minidl.kernels), barriers.
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ptx_selftest  # noqa: E402
from minidl.bench._nvcc import ARCH, compile_cubin, find_nvcc  # noqa: E402
from minidl.kernels import FAMILIES, loader  # noqa: E402

CHECK_FLAGS = ("-std=c++17", "--Werror", "all-warnings")
SELFTEST = Path(__file__).resolve().parent / "emu_selftest.cu"


def sources():
    """(family, path, kernel name expressions, -D options) of every source nvcc must compile."""
    return [(f, loader.source_path(f), m.NAMES, loader.define_options(m.DEFINES)) for f, m in FAMILIES.items()] + [
        ("emu_selftest", SELFTEST, (), ()), ("ptx_selftest", ptx_selftest.SOURCE, ptx_selftest.KERNELS, ())]


def compile_family(nvcc, path, names, options=()):
    """(returncode, log, {kernel: resources}) for one source."""
    compiled = compile_cubin(path, names, CHECK_FLAGS + tuple(options), nvcc)
    return compiled.returncode, compiled.log, compiled.resources


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
