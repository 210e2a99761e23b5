"""ptx_selftest.cu and its kernels as name expressions (the templates as the tests instantiate
them), for the emulation tests, the nvcc and NVRTC compile checks and the SASS audit test; and
the hardware check of the emulator's lane maps, which needs no pytest:

    python tests/kernels/ptx_selftest.py --json FILE --device gpu|emulator [--suite ptx|wgmma]

runs every case of ptx_selftest_expected.json (--suite wgmma: wgmma_selftest.cu's Hopper
instructions, built for sm_90a, against wgmma_selftest_expected.json: wgmma products for every
swizzle mode and operand major-ness, the accumulator fragment, the mbarrier phase walk and a
cp.async pipeline on mbarriers; setmaxnreg only in the emulator tests, whose register counts at
launch are unknown) (the inputs and the emulator's answers, written on
a CPU machine by --generate: the GPU machine needs no g++) on the GPU (CuPy) or on the emulator,
and compares each output with the answer: bit for bit, except the tensor-core products (mma,
tile_gemm), whose order of accumulation the emulator does not model (a tolerance relative to the
case's largest answer). Subnormal operands check what the emulator assumes: the tensor cores
keep them (mma), and so do cvt.rna.tf32.f32 and fma.rn.relu.bf16x2 (round_tf32, fma_relu_pairs).
The subnormal mma cases are informational: they test the hardware, not our kernels (v1 and v2
issue the same mma), so their mismatches are recorded but do not fail the check (a launch error
still does). FILE is written after every case: {"device", "cases": [{"name", "status": "passed" |
"failed" | "error", "informational", "mismatches", "first_mismatch"}], "passed"}, with an "error"
where the run stopped; exit 0 when every case passed but the informational ones, else 1.
"""
import argparse
import json
import sys
import traceback
from pathlib import Path

import numpy

SOURCE = Path(__file__).resolve().parent / "ptx_selftest.cu"
EXPECTED = SOURCE.with_name("ptx_selftest_expected.json")
LDMATRIX = tuple(f"ldmatrix_rows<{m}, {t}>" for m in (1, 2, 4) for t in ("false", "true"))
KERNELS = LDMATRIX + ("mma_fragments<true>", "mma_fragments<false>", "tile_gemm<true, 0>", "tile_gemm<false, 0>",
                      "tile_gemm<true, 1>", "round_tf32", "fma_relu_pairs", "quotients", "shared_words<false>",
                      "shared_words<true>")
PRODUCT_TOLERANCE = 1e-5  # relative to the largest |output| of the case: fp32 sums of 16 to 88 terms
K_WORDS = 44  # tile_gemm: 6 k-tiles of 8 words through 3 stages, the last one half zero-filled
DTYPES = {"u32": numpy.uint32, "i32": numpy.int32, "f32": numpy.float32}
WGMMA_SOURCE = SOURCE.with_name("wgmma_selftest.cu")
WGMMA_EXPECTED = SOURCE.with_name("wgmma_selftest_expected.json")
WGMMA_PRODUCTS = tuple(f"wgmma_product<{n}, {a}, {b}, false>" for n in (8, 64, 128) for a in ("false", "true")
                       for b in ("false", "true")) + tuple(f"wgmma_product<64, false, {b}, true>" for b in ("false", "true"))
WGMMA_KERNELS = WGMMA_PRODUCTS + ("wgmma_misuse", "mbarrier_phases", "mbarrier_pipeline", "register_budget")


def generate_cases(rng):
    """The cases' launches and inputs (every array as 32-bit words); outputs zero-filled."""
    def words(values):
        return numpy.ascontiguousarray(values).view(numpy.uint32)

    def normal(n):
        return rng.standard_normal(n).astype(numpy.float32)

    cases = []
    for name in LDMATRIX:
        matrices = int(name.split("<")[1].split(",")[0])
        rows = rng.permutation(1 << 16)[:32 * 8].astype(numpy.uint16)
        args = [("u32", words(rows)), ("i32", rng.permutation(32).astype(numpy.int32)), ("scalar_i32", 0),
                ("u32", numpy.zeros(32 * matrices, numpy.uint32))]
        cases.append({"name": name, "kernel": name, "grid": 1, "block": 32, "args": args, "outputs": [3]})
    def operand(bf16, n):  # n words: fp32 normals, or pairs of bf16 ones (their high halves)
        return words((words(normal(2 * n)) >> 16).astype(numpy.uint16)) if bf16 == "true" else words(normal(n))

    for bf16 in ("true", "false"):
        for kernel, k in {"mma_fragments": 8, "tile_gemm": K_WORDS}.items():
            args = [("u32", operand(bf16, 16 * k)), ("u32", operand(bf16, 8 * k)), ("f32", normal(16 * 8)),
                    ("f32", numpy.zeros(16 * 8, numpy.float32))]
            if kernel == "tile_gemm":
                args.append(("scalar_i32", K_WORDS))
            name = f"{kernel}<{bf16}>" if kernel == "mma_fragments" else f"tile_gemm<{bf16}, 0>"
            cases.append({"name": name, "kernel": name, "grid": 1, "block": 32, "args": args, "outputs": [3],
                          "tolerance": PRODUCT_TOLERANCE})
    for bf16 in ("true", "false"):  # subnormal A (B near 1, C zero): whether the tensor cores keep them
        a = operand(bf16, 16 * 8)
        a = words(a & numpy.uint32(0x807F807F if bf16 == "true" else 0x807FFFFF))  # exponent 0: subnormal
        args = [("u32", a), ("u32", operand(bf16, 8 * 8)), ("f32", numpy.zeros(16 * 8, numpy.float32)),
                ("f32", numpy.zeros(16 * 8, numpy.float32))]
        cases.append({"name": f"mma_fragments<{bf16}> subnormal", "kernel": f"mma_fragments<{bf16}>", "grid": 1,
                      "block": 32, "args": args, "outputs": [3], "tolerance": PRODUCT_TOLERANCE})
    ties = numpy.array([0x3F801000, 0xBF801000, 0x3F803000, 0x3FFFF000, 0x00001000, 0x00000FFF, 0x7F7FF000],
                       numpy.uint32).view(numpy.float32)
    x = numpy.concatenate([ties, normal(249) * 1e3])
    cases.append({"name": "round_tf32", "kernel": "round_tf32", "grid": 2, "block": 64,
                  "args": [("f32", x), ("u32", numpy.zeros(x.size, numpy.uint32)), ("scalar_i32", x.size)],
                  "outputs": [1]})
    a, b, c = (rng.integers(0, 1 << 32, 256, dtype=numpy.uint64).astype(numpy.uint32) for _ in range(3))
    a[:64] = (a[:64] & 0x807F807F) | 0x3F003F00  # products near 1, addends of many sizes: ties and cancellation
    b[:64] = (b[:64] & 0x807F807F) | 0x3F803F80
    c[:64] = (c[:64] & 0x80FF80FF) | 0x3E003E00
    cases.append({"name": "fma_relu_pairs", "kernel": "fma_relu_pairs", "grid": 2, "block": 64,
                  "args": [("u32", a), ("u32", b), ("u32", c), ("u32", numpy.zeros(256, numpy.uint32)),
                           ("scalar_i32", 256)], "outputs": [3]})
    return cases


def generate_wgmma_cases(rng):
    """wgmma_selftest.cu's cases: an m64n8k16 product for every swizzle mode and major-ness of A
    and B, larger N, A from registers, chained products onto an initial accumulator; the mbarrier
    walks. Inputs as 32-bit words, outputs zero-filled."""
    import wgmma_layouts

    def product(label, *shape, **options):
        name, args, shared, _ = wgmma_layouts.product_case(rng, *shape, **options)
        kinds = ["u32", "scalar_i32", "i32", "u32", "f32", "scalar_i32", "scalar_i32", "f32"]
        return {"name": f"{name} {label}", "kernel": name, "grid": 1, "block": 128, "shared_mem": shared,
                "args": list(zip(kinds, args)), "outputs": [7], "tolerance": PRODUCT_TOLERANCE}

    swizzles = {0: "none", 1: "128B", 2: "64B", 3: "32B"}
    cases = [product(f"swizzle {swizzles[s]}", 8, ta, tb, s, s) for s in swizzles for ta in (False, True)
             for tb in (False, True)]
    cases += [product("A 128B, B 32B, accumulate, twice", 64, False, True, 1, 3, accumulate=1, repeats=2),
              product("A M-major 64B, B N-major 32B", 64, True, True, 2, 3),
              product("A from registers, B N-major 128B", 64, False, True, 0, 1, rs=True)]
    cases.append({"name": "mbarrier_phases", "kernel": "mbarrier_phases", "grid": 1, "block": 96,
                  "args": [("u32", numpy.zeros(96, numpy.uint32))], "outputs": [0]})
    data = rng.integers(0, 1 << 32, 5 * 128, dtype=numpy.uint64).astype(numpy.uint32)
    cases.append({"name": "mbarrier_pipeline", "kernel": "mbarrier_pipeline", "grid": 1, "block": 64,
                  "args": [("u32", data), ("scalar_i32", 5), ("scalar_i32", 0), ("u32", numpy.zeros_like(data))],
                  "outputs": [3]})
    return cases


# per suite: the source, its kernels, its cases, the architecture NVRTC builds it for
SUITES = {"ptx": (SOURCE, KERNELS, generate_cases, ()),
          "wgmma": (WGMMA_SOURCE, WGMMA_KERNELS, generate_wgmma_cases, ("-arch=sm_90a",))}


def answers(suite):
    """The suite's file of cases and the emulator's answers"""
    return EXPECTED if suite == "ptx" else WGMMA_EXPECTED


def to_json(case):
    """The case with its arguments as [kind, value]: an int for a scalar, else the 32-bit words."""
    def value(kind, v):
        return int(v) if kind.startswith("scalar") else [int(w) for w in numpy.asarray(v).view(numpy.uint32)]
    return {**case, "args": [[kind, value(kind, v)] for kind, v in case["args"]]}


def arguments(case, xp):
    """The launch's arguments from the JSON case: arrays on `xp`, scalars as NumPy scalars."""
    args = []
    for kind, value in case["args"]:
        if kind.startswith("scalar_"):
            args.append(DTYPES[kind[len("scalar_"):]](value))
        else:
            args.append(xp.asarray(numpy.array(value, numpy.uint32).view(DTYPES[kind])))
    return args


def load(device, suite="ptx"):
    """The module of the suite's source on the device: CuPy's RawModule, or the emulator's."""
    source, kernels, _, arch = SUITES[suite]
    if device == "emulator":
        import emulator
        return emulator.load(str(source), kernels), numpy
    import cupy
    from minidl.kernels import loader
    options = loader.compile_options({}) + (f"-I{SOURCE.parent}",) + arch  # the .cu includes ../../kernels/*.cuh
    return cupy.RawModule(code=source.read_text(), options=options, name_expressions=kernels), cupy


def run(module, xp, case):
    """The case's outputs, as lists of 32-bit words."""
    args = arguments(case, xp)
    module.get_function(case["kernel"])((case["grid"],), (case["block"],), tuple(args),
                                        shared_mem=case.get("shared_mem", 0))
    host = [args[i] if xp is numpy else xp.asnumpy(args[i]) for i in case["outputs"]]
    return [[int(w) for w in array.view(numpy.uint32)] for array in host]


def compare(case, outputs):
    """(mismatches, the first one as text or None) of the outputs against the case's answers."""
    mismatches, first = 0, None
    for index, got, want in zip(case["outputs"], outputs, case["expected"]):
        got, want = numpy.array(got, numpy.uint32), numpy.array(want, numpy.uint32)
        if "tolerance" in case:
            g, w = got.view(numpy.float32).astype(numpy.float64), want.view(numpy.float32).astype(numpy.float64)
            bad = ~(numpy.abs(g - w) <= case["tolerance"] * max(numpy.abs(w).max(), 1e-30))
        else:
            bad = got != want
        mismatches += int(bad.sum())
        if first is None and bad.any():
            i = int(numpy.flatnonzero(bad)[0])
            first = f"argument {index} word {i}: got {got[i]:#010x}, the emulator's answer {want[i]:#010x}"
    return mismatches, first


def informational(case):
    """Whether the case asks about the hardware only (the tensor cores' subnormals): no verdict."""
    return case["kernel"].startswith("mma_fragments") and case["name"].endswith(" subnormal")


def check(device, result_path, suite="ptx"):
    """Runs every case of the suite on `device`, writing the result file after each; True when all
    passed."""
    result = {"device": device, "cases": [], "passed": False}

    def write():
        Path(result_path).write_text(json.dumps(result, indent=1) + "\n")

    write()
    try:
        cases = json.loads(answers(suite).read_text())["cases"]
        module, xp = load(device, suite)
        for case in cases:
            entry = {"name": case["name"], "status": "error", "informational": informational(case),
                     "mismatches": None, "first_mismatch": None}
            result["cases"].append(entry)
            try:
                entry["mismatches"], entry["first_mismatch"] = compare(case, run(module, xp, case))
                entry["status"] = "passed" if entry["mismatches"] == 0 else "failed"
            except Exception as error:  # a launch that faults: recorded, and the context may be gone
                entry["first_mismatch"] = f"{type(error).__name__}: {error}"
            write()
        result["passed"] = bool(cases) and all(c["status"] == "passed" or c["status"] == "failed" and
                                                c["informational"] for c in result["cases"])
    except Exception as error:
        result["error"] = "".join(traceback.format_exception_only(type(error), error)).strip()
    write()
    return result["passed"]


def generate(suite="ptx"):
    """Writes the suite's answers file: the cases and the emulator's outputs for them."""
    module, _ = load("emulator", suite)
    cases = [to_json(case) for case in SUITES[suite][2](numpy.random.default_rng(20))]
    for case in cases:
        case["expected"] = run(module, numpy, case)
    answers(suite).write_text(json.dumps({"cases": cases}, separators=(",", ":")) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python tests/kernels/ptx_selftest.py",
                                     description="the emulator's PTX lane maps checked on a device")
    parser.add_argument("--json", help="the result file, written after every case")
    parser.add_argument("--device", choices=["gpu", "emulator"], default="emulator")
    parser.add_argument("--suite", choices=sorted(SUITES), default="ptx",
                        help="ptx: ptx_selftest.cu (default); wgmma: wgmma_selftest.cu (sm_90a)")
    parser.add_argument("--generate", action="store_true",
                        help="write the suite's answers file from the emulator (on a CPU machine) instead")
    args = parser.parse_args(argv)
    if args.generate:
        generate(args.suite)
        return 0
    if not args.json:
        parser.error("--json FILE is required (the result file)")
    if not Path(args.json).resolve().parent.is_dir():
        parser.error(f"--json {args.json}: its folder does not exist (create it first)")
    return 0 if check(args.device, args.json, args.suite) else 1


if __name__ == "__main__":
    sys.exit(main())
