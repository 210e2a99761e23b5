"""Compile kernels/*.cu with nvcc for sm_90 (a family's ARCH where it has one: conv_v3's sm_90a)
and read ptxas's resource report per kernel.

    python tests/kernels/nvcc_check.py [--json FILE]                 # a table, or JSON, of every kernel
    python tests/kernels/nvcc_check.py --prepared FILE --json OUT    # FILE to OUT when it is current

Each family is compiled as a small translation unit that includes the .cu and takes the
address of every kernel minidl.kernels launches (each family's NAMES), which instantiates the
templates, with the family's constants as -D options (its DEFINES; minidl.bench._nvcc, shared
with the SASS audit); so are the emulator's selftests. Warnings are errors. The report per
kernel: registers, spill stores and loads (bytes), stack frame, static shared memory (dynamic
shared memory is sized at launch: minidl.kernels), barriers. The JSON is rewritten after each
source, so a run cut short keeps what it compiled.

The report carries `key`, a hash of everything it depends on but the compiler: a report made
on a machine with nvcc (tests/gpu_check.sh --prepare) serves a machine without one, or one
whose time is dear, for as long as the sources are unchanged (--prepared).
"""
import argparse
import hashlib
import json
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ptx_selftest  # noqa: E402
from minidl.bench._nvcc import ARCH, FLAGS, compile_cubin, find_nvcc  # noqa: E402
from minidl.fileio import write_json_atomic  # noqa: E402
from minidl.kernels import FAMILIES, loader  # noqa: E402

CHECK_FLAGS = ("-std=c++17", "--Werror", "all-warnings")
SELFTEST = Path(__file__).resolve().parent / "emu_selftest.cu"
PREPARE = "run `bash tests/gpu_check.sh --prepare` on a machine with nvcc (the CPU machine)"


def sources():
    """(family, path, kernel name expressions, -D options, architecture) of every source nvcc must compile."""
    return [(f, loader.source_path(f), m.NAMES, loader.define_options(m.DEFINES), loader.required_arch(m) or ARCH)
            for f, m in FAMILIES.items()] + [
        ("emu_selftest", SELFTEST, (), (), ARCH), ("ptx_selftest", ptx_selftest.SOURCE, ptx_selftest.KERNELS, (), ARCH)]


def source_key():
    """A hash of what the report depends on but the compiler: every file of kernels/ (the headers
    included), the selftests, each source's kernel names and -D options, the flags."""
    listed = sources()
    digest = hashlib.sha256(repr((FLAGS, CHECK_FLAGS, [(f, names, options, arch)
                                                       for f, _, names, options, arch in listed])).encode())
    kernel_dir = loader.source_path(next(iter(FAMILIES))).parent
    for path in sorted(kernel_dir.iterdir()) + [SELFTEST, ptx_selftest.SOURCE]:
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def compile_family(nvcc, path, names, options=(), arch=ARCH):
    """(returncode, log, {kernel: resources}) for one source."""
    compiled = compile_cubin(path, names, CHECK_FLAGS + tuple(options), nvcc, arch)
    return compiled.returncode, compiled.log, compiled.resources


def compile_all(nvcc, parallel=2, done=lambda results: None):
    """{family: (returncode, log, kernels)}, `parallel` compilers at a time; `done(results so far)`
    after each source."""
    results = {}
    with ThreadPoolExecutor(parallel) as pool:
        futures = {pool.submit(compile_family, nvcc, path, names, options, arch): family
                   for family, path, names, options, arch in sources()}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            done(results)
    return {family: results[family] for family, *_ in sources()}  # in the order of sources()


def report_of(nvcc, key, results):
    archs = {family: arch for family, *_, arch in sources()}
    return {"key": key, "nvcc": nvcc, "arch": {f: archs[f] for f in results},
            "failed": [f for f, (code, _, _) in results.items() if code],
            "compiled": sorted(results), "kernels": {f: k for f, (_, _, k) in results.items()}}


def table(results):
    lines = [f"{'kernel':44} {'regs':>5} {'spill st/ld':>12} {'stack':>6} {'smem':>6}"]
    for family, (_, _, kernels) in results.items():
        for name, r in sorted(kernels.items()):
            spills = f"{r.get('spill_store_bytes', '?')}/{r.get('spill_load_bytes', '?')}"
            lines.append(f"{family + ': ' + name:44} {r.get('registers', '?'):>5} {spills:>12} "
                         f"{r.get('stack_bytes', '?'):>6} {r['smem_bytes']:>6}")
    return "\n".join(lines)


def copy_prepared(prepared, out):
    """Copy the prepared report to `out` when its key is the sources' key; else write why not. 0 or 1."""
    key = source_key()
    try:
        report = json.loads(Path(prepared).read_text())
    except FileNotFoundError:
        report, problem = None, f"missing: {prepared} does not exist: {PREPARE}"
    except ValueError as error:
        report, problem = None, f"unreadable: {prepared} is not JSON ({error}): {PREPARE}"
    else:
        problem = None if report.get("key") == key else f"stale: {prepared} was made from other sources: {PREPARE}"
    if problem is None:
        report = {**report, "prepared": str(prepared)}
        write_json_atomic(out, report)
        print(f"nvcc_check: the prepared report is current ({len(report['kernels'])} sources, "
              f"failed: {report['failed'] or 'none'})")
        return 1 if report["failed"] else 0
    write_json_atomic(out, {"failed": problem, "key": key, "prepared_key": (report or {}).get("key")})
    print(f"nvcc_check: {problem}", file=sys.stderr)
    return 1


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the report here (after each source)")
    parser.add_argument("--prepared", metavar="FILE", help="copy this earlier report to --json when it is current, "
                        "compiling nothing")
    args = parser.parse_args(argv)
    if args.prepared:
        if not args.json:
            parser.error("--prepared needs --json OUT")
        return copy_prepared(args.prepared, args.json)
    nvcc = find_nvcc()
    if nvcc is None:
        print("nvcc_check: no nvcc found (PATH, $CUDA_PATH/bin, /usr/local/cuda/bin)", file=sys.stderr)
        return 2
    key = source_key()

    def save(results):
        if args.json:
            write_json_atomic(args.json, report_of(nvcc, key, results))
    results = compile_all(nvcc, done=save)
    print(table(results))
    failed = report_of(nvcc, key, results)["failed"]
    for family in failed:
        print(f"\n{family}: nvcc failed\n{results[family][1]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
