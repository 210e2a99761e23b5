"""`python -m minidl.bench standalone --family F --pass P --shape N,H,W,C,K,R,STRIDE,PAD [--build]`:
one kernel plan as a self-checking CUDA program (llm.c's dev/cuda) for Nsight Compute,
compute-sanitizer and any CUDA runtime.

It includes the kernel source the launcher compiles and launches it as the launcher does: the
launcher's own code runs the call with its launches recorded (minidl.bench._recorder), so every
grid, block, shared-memory size, constant and argument is the launcher's, never a second copy.

Details: docs/kernels.md, "minidl/bench/standalone.py".
"""
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy

from minidl.backend import BF16
from minidl.bench._nvcc import ARCH, find_nvcc
from minidl.bench._recorder import Recorder
from minidl.cli import OneLineErrorParser
from minidl.errors import UserError
from minidl.fileio import writable
from minidl.kernels import FAMILIES as KERNEL_FAMILIES, Kernels, loader
from minidl.kernels.autotune import REFERENCE_TOLERANCE
from minidl.kernels.conv import conv_geometry
from minidl.kernels.launch import NULL, cxx_type

HOST_PART = Path(__file__).with_name("standalone_conv.cu")
MULTIPROCESSORS = 132  # an H100 SXM's or an H200's: the launcher's split-K choices depend on it


@dataclass(frozen=True)
class Family:
    """A kind of kernel the program can run: the Plan version its launcher runs
    (minidl.kernels.autotune.Plan) and nvcc's target options for it."""
    version: str
    target: tuple


SM_90 = (f"-arch={ARCH}",)
SM_90A = ("-gencode=arch=compute_90a,code=sm_90a",)  # wgmma, setmaxnreg
FAMILIES = {"conv_v1": Family("v1", SM_90), "conv_v2": Family("v2", SM_90), "conv_v3": Family("v3", SM_90A)}

PASSES = {"fwd": "conv_fwd", "dgrad": "conv_dgrad", "wgrad": "conv_wgrad"}
ROLES = {"fwd": ("x", "w", "y"), "dgrad": ("dy", "w", "dx"), "wgrad": ("x", "dy", "dw")}  # a, b -> output
DTYPES = {"bf16": BF16, "tf32": numpy.float32, "fp32": numpy.float32}
BUFFER_ROLES = ("OPERAND_A", "OPERAND_B", "OUTPUT")  # standalone_conv.cu's Role; the rest are WORK


@dataclass
class Buffer:
    name: str
    role: str
    array: numpy.ndarray


@dataclass
class RecordedPlan:
    """One pass of one convolution as its launcher runs it."""
    family: str
    conv_pass: str     # "fwd", "dgrad", "wgrad"
    mode: str          # "bf16", "tf32" or "fp32": what the kernel computes in
    geometry: tuple    # the launcher's N, H, W, C, K, R, S, P, Q, stride, padding
    plan: object       # minidl.kernels.autotune.Plan
    launches: list     # minidl.bench._recorder.Launch, in order
    buffers: list      # Buffer, in order of first use

    def label(self):
        names = "N,H,W,C,K,R,S,P,Q,stride,pad"
        return (f"{self.family} {self.conv_pass} {self.mode}, plan {self.plan.label()}, {names} = "
                f"{','.join(map(str, self.geometry))}")

    def stem(self):
        n, h, w, c, k, r, _, _, _, stride, pad = self.geometry
        return (f"{self.family}_{self.conv_pass}_{self.plan.tile}_s{self.plan.splits}_"
                f"{n}x{h}x{w}x{c}_k{k}r{r}s{stride}p{pad}")


def parse_shape(text):
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 8 or min(shape[:7]) < 1 or shape[7] < 0:
        raise UserError(f"--shape {text!r}: give N,H,W,C,K,R,STRIDE,PAD (eight integers, PAD >= 0; "
                        "an R×R filter), e.g. 256,56,56,64,64,3,1,1")
    return shape


def record(family, conv_pass, shape, dtype="bf16", tile=None, splits=None, multiprocessors=MULTIPROCESSORS):
    """The RecordedPlan of `family` for one pass of the convolution `shape` (N, H, W, C, K, R, stride,
    padding) in `dtype`: the first plan the launcher offers for the family there (`tile`,
    `splits`: the one with that tile, that split), run by the launcher with its launches
    recorded. A UserError where the launcher offers no such plan."""
    n, h, w, c, k, r, stride, pad = shape
    recorder = Recorder()
    kernels = Kernels(recorder.load, multiprocessors, allow_tf32=dtype != "fp32")
    element = DTYPES[dtype]
    try:
        geometry = conv_geometry((n, h, w, c), (k, r, r, c), stride, pad)
        v1_tile = kernels.conv_tile(element, c, k)  # the launcher's choice between TF32 and exact fp32
    except ValueError as error:
        raise UserError(f"--shape {','.join(map(str, shape))}: {error}") from None
    mode = "bf16" if element == BF16 else "tf32" if v1_tile.tensor_cores else "fp32"
    if mode != dtype:
        raise UserError(f"--dtype {dtype}: the launcher runs C={c}, K={k} in exact fp32 (TF32 needs channel counts "
                        "that are multiples of 4): give --dtype fp32")
    p, q = geometry[7:9]
    x, wt, dy = (numpy.empty(dims, dtype=element) for dims in ((n, h, w, c), (k, r, r, c), (n, p, q, k)))
    operands, call = {
        "fwd": ((x, wt), lambda plan: kernels.conv_forward(x, wt, stride, pad, plan=plan)),
        "dgrad": ((dy, wt), lambda plan: kernels.conv_grad_input(dy, wt, x.shape, stride, pad, plan=plan)),
        "wgrad": ((x, dy), lambda plan: kernels.conv_grad_weight(x, dy, wt.shape, stride, pad, plan=plan))}[conv_pass]
    offered = [p for p in kernels.plans(PASSES[conv_pass], operands, geometry) if p.version == FAMILIES[family].version]
    chosen = [p for p in offered if tile in (None, p.tile) and splits in (None, p.splits)]
    if not chosen:
        wanted = " and ".join(([f"tile {tile}"] if tile else []) + ([f"{splits} splits"] if splits else []))
        raise UserError(f"the launcher offers no {family} plan{f' with {wanted}' if wanted else ''} "
                        f"for {conv_pass} {dtype} {','.join(map(str, shape))}: "
                        f"it offers {', '.join(p.label() for p in offered) or 'none'} (choose with --tile, --splits)")
    output = call(chosen[0])
    return RecordedPlan(family, conv_pass, mode, geometry, chosen[0], recorder.launches,
                _buffers(recorder.launches, operands, output, ROLES[conv_pass]))


def _buffers(launches, operands, output, names):
    """The arrays the launches pass, in order of first use: the operands, the output, and work
    arrays the launcher made (split-K partial sums)."""
    known = {id(operands[0]): (names[0], "OPERAND_A"), id(operands[1]): (names[1], "OPERAND_B"),
             id(output): (names[2], "OUTPUT")}
    found = {}
    for launch in launches:
        for arg in launch.args:
            if isinstance(arg, numpy.ndarray) and id(arg) not in found:
                work = sum(b.role == "WORK" for b in found.values())
                name, role = known.get(id(arg), (f"work{work}", "WORK"))
                found[id(arg)] = Buffer(name, role, arg)
    missing = {role for _, role in known.values()} - {b.role for b in found.values()}
    if missing:
        raise AssertionError(f"the launches never pass the {', '.join(sorted(missing))} array: a launcher that "
                             "copies its operands (misaligned views) cannot be recorded this way")
    return list(found.values())


# ---- the program -------------------------------------------------------------------------------

def cxx_argument(arg, index_of):
    """A recorded launch argument as C++: a buffer, nullptr, or an integer of the kernel's type."""
    if isinstance(arg, numpy.ndarray):
        return f"({cxx_type(arg.dtype)}*)buffers[{index_of[id(arg)]}]"
    if isinstance(arg, numpy.uint64) and arg == NULL:
        return "nullptr"
    if isinstance(arg, numpy.int32):
        return str(int(arg))
    if isinstance(arg, numpy.int64):
        return f"{int(arg)}LL"
    raise ValueError(f"a launch argument {arg!r} of type {type(arg).__name__}: minidl.bench.standalone.cxx_argument "
                     "does not render it yet")


def defines(launches):
    """#define lines of the constants of every family the launches use (their launcher's DEFINES)."""
    values = {}
    for family in dict.fromkeys(launch.family for launch in launches):
        for name, value in KERNEL_FAMILIES[family].DEFINES.items():
            if values.setdefault(name, value) != value:
                raise ValueError(f"{name} is {values[name]} in one family and {value} in {family}")
    return [f"#define {name} {value}" for name, value in sorted(values.items())]


def build_command(nvcc, family, source, binary):
    return [nvcc, "-std=c++17", "-O3", "-lineinfo", *FAMILIES[family].target, "-cudart", "shared",
            f"-I{loader.source_dir()}", "-o", str(binary), str(source)]


def render(plan, command_line):
    """The program's text."""
    n, h, w, c, k, r, s, p, q, stride, pad = plan.geometry
    stem = plan.stem()
    index_of = {id(b.array): i for i, b in enumerate(plan.buffers)}
    sources = list(dict.fromkeys(launch.family for launch in plan.launches))
    build = " ".join(build_command("nvcc", plan.family, f"{stem}.cu", stem))
    lines = [
        f"// Standalone, self-checking: {plan.label()}.",
        f"// Written by `{command_line}`: do not edit, regenerate.",
        f"// The kernels are {', '.join(f'kernels/{f}.cu' for f in sources)} (sources hash "
        f"{', '.join(loader.sources_hash(f) for f in sources)}), launched as {', '.join(f'minidl/kernels/{f}.py' for f in sources)} "
        "launches them for this call (recorded from its own functions).",
        "//",
        f"// Build:    {build}",
        f"// Run:      ./{stem} [REPEATS [SEED]]    exit 0: every output written and within tolerance; REPEATS 0: no timing",
        f"// Sanitize: compute-sanitizer --tool memcheck (racecheck, synccheck) ./{stem} 0",
        f"// Profile:  ncu --clock-control none --set full ./{stem} 1",
        f"// No GPU:   g++ -std=c++17 -O2 -DSTANDALONE_HOST_ONLY -x c++ {stem}.cu -o {stem}-host   (the host half)",
        "",
        "// ---- the launcher's compile-time constants ----",
        *defines(plan.launches),
        "#ifndef STANDALONE_HOST_ONLY",
        *(f'#include "{family}.cu"' for family in sources),
        "#endif",
        "",
        HOST_PART.read_text().rstrip("\n"),
        "",
        "// ---- this plan ----",
        f'const Problem PROBLEM = {{"{plan.label()}", {PASSES[plan.conv_pass].upper()}, {n}, {h}, {w}, {c}, {k}, {r}, '
        f"{s}, {p}, {q}, {stride}, {pad}, {REFERENCE_TOLERANCE[plan.mode]!r}}};",
        "const Buffer BUFFERS[] = {",
        *(f'    {{"{b.name}", {b.role}, {"BF16" if b.array.dtype == BF16 else "F32"}, {b.array.size}}},'
          for b in plan.buffers),
        "};",
        f"const int BUFFER_COUNT = {len(plan.buffers)};",
        "",
        "#ifndef STANDALONE_HOST_ONLY",
        "void prepare_kernels() {  // the launcher's dynamic shared-memory opt-ins",
        *(f"    CUDA_CHECK(cudaFuncSetAttribute({launch.name}, cudaFuncAttributeMaxDynamicSharedMemorySize, "
          f"{launch.shared_opt_in}));" for launch in _first_opt_ins(plan.launches)),
        "}",
        "",
        "void run_plan(void* const* buffers) {  // the launcher's launches, in order",
    ]
    for launch in plan.launches:
        args = ", ".join(cxx_argument(a, index_of) for a in launch.args)
        lines += [f"    {launch.name}<<<dim3{launch.grid}, dim3{launch.block}, {launch.shared_mem}>>>({args});",
                  f'    check_launch("{launch.name}");']
    return "\n".join(lines + ["}", "#endif", ""])


def _first_opt_ins(launches):
    seen = set()
    for launch in launches:
        if launch.shared_opt_in and (launch.family, launch.name) not in seen:
            seen.add((launch.family, launch.name))
            yield launch


def build(family, source, binary):
    """nvcc's (returncode, output) for the program at `source`."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise UserError("--build needs nvcc (PATH, $CUDA_PATH/bin, /usr/local/cuda/bin): install the CUDA toolkit, "
                        "or leave --build out and build the program where nvcc is")
    result = subprocess.run(build_command(nvcc, family, source, binary), capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


def parse_args(argv):
    parser = OneLineErrorParser(prog="python -m minidl.bench standalone", description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", required=True, choices=sorted(FAMILIES))
    parser.add_argument("--pass", dest="conv_pass", required=True, choices=sorted(PASSES))
    parser.add_argument("--shape", required=True, type=parse_shape, metavar="N,H,W,C,K,R,STRIDE,PAD")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                        help="bf16 data, or float32 data on TF32 tensor cores or in exact fp32")
    parser.add_argument("--tile", help="the plan's tile (default: the first plan the launcher offers the family)")
    parser.add_argument("--splits", type=int, help="the plan's split of the reduction (one the launcher offers)")
    parser.add_argument("--multiprocessors", type=int, default=MULTIPROCESSORS,
                        help="of the GPU the launcher plans for (split-K depends on it)")
    parser.add_argument("--out", default="standalone", help="folder for the program (and the binary)")
    parser.add_argument("--build", action="store_true", help="compile it with nvcc")
    return parser.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    if args.multiprocessors < 1:
        raise UserError(f"--multiprocessors {args.multiprocessors}: give a positive count (an H200 has 132)")
    out = writable("--out", args.out, folder=True)
    plan = record(args.family, args.conv_pass, args.shape, args.dtype, args.tile, args.splits, args.multiprocessors)
    source, binary = out / f"{plan.stem()}.cu", out / plan.stem()
    source.write_text(render(plan, "python -m minidl.bench standalone " + " ".join(argv)))
    print(f"wrote {source}: {plan.label()}, {len(plan.launches)} launch{'es' if len(plan.launches) > 1 else ''}")
    if not args.build:
        print("build: " + " ".join(build_command("nvcc", plan.family, source, binary)))
        return 0
    code, log = build(plan.family, source, binary)
    if code != 0:
        print(log.rstrip())
        print(f"nvcc failed ({code}) on {source}")
        return 1
    print(f"built {binary}: run it on a GPU ({binary} [REPEATS [SEED]])")
    return 0
