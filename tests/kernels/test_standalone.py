"""The standalone programs (python -m minidl.bench standalone): the launches written into a
program, parsed back, against launch geometry computed here by hand and against what the
launcher launches when it really runs (on the CPU emulator); the program's host half (its inputs,
its float64 reference, its check) compiled by g++ against the NumPy reference; every family and
pass built by nvcc (it cannot run here), v3 for sm_90a."""
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy
import pytest

import oracle
from emulated_device import emulated_module
from minidl.backend import BF16
from minidl.bench import standalone
from minidl.bench.__main__ import main as bench_main
from minidl.bench._nvcc import find_nvcc
from minidl.kernels import Kernels
from minidl.ops import conv as conv_ref

LAUNCH = re.compile(r"^    (?P<name>\S.*?)<<<dim3\((?P<grid>[\d, ]+)\), dim3\((?P<block>[\d, ]+)\), (?P<shared>\d+)>>>"
                    r"\((?P<args>.*)\);$", re.MULTILINE)
OPT_IN = re.compile(r"cudaFuncSetAttribute\((?P<name>.*), cudaFuncAttributeMaxDynamicSharedMemorySize, "
                    r"(?P<bytes>\d+)\)\);")
BUFFER = re.compile(r'^    \{"(\w+)", (\w+), (\w+), (\d+)\},$', re.MULTILINE)
ODD = (2, 7, 5, 8, 16, 3, 2, 1)  # N, H, W, C, K, R, stride, padding: P = 4, Q = 3, stride-2 phases of unequal size
PASSES = ("fwd", "dgrad", "wgrad")


def parse(program):
    """[(kernel, grid, block, shared memory, [arguments])] and {kernel: opt-in} written in a program."""
    launches = [(m["name"], tuple(map(int, m["grid"].split(", "))), tuple(map(int, m["block"].split(", "))),
                 int(m["shared"]), m["args"].split(", ")) for m in LAUNCH.finditer(program)]
    return launches, {m["name"]: int(m["bytes"]) for m in OPT_IN.finditer(program)}


def program_of(family, conv_pass, shape, **plan):
    recorded = standalone.record(family, conv_pass, shape, **plan)
    return recorded, standalone.render(recorded, "test")


def geometry_arguments(n, h, w, c, k, r, stride, pad):
    p, q = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - r) // stride + 1
    return [str(v) for v in (n, h, w, c, k, r, r, p, q, stride, pad)]


def test_v1_forward_launch_by_hand():
    _, program = program_of("conv_v1", "fwd", ODD)
    (launch,), opt_ins = parse(program)
    # Bf16Tile: 128×128×32, 3 stages of A and B, each the larger of 128·(32 + 8) and 32·(128 + 8) bf16
    smem = 3 * 2 * max(128 * 40, 32 * 136) * 2
    assert launch[:4] == (f"conv_fwd<TileConfig<__nv_bfloat16, true, 128, 128, 32, 3, {smem}>>", (1, 1, 1), (256, 1, 1),
                          smem)
    assert launch[4] == ["(__nv_bfloat16*)buffers[0]", "(__nv_bfloat16*)buffers[1]", "(__nv_bfloat16*)buffers[2]",
                         *geometry_arguments(*ODD)]
    assert opt_ins == {launch[0]: smem}  # over the 48 KiB a launch may take without opting in
    assert BUFFER.findall(program) == [("x", "OPERAND_A", "BF16", "560"), ("w", "OPERAND_B", "BF16", "1152"),
                                       ("y", "OUTPUT", "BF16", "384")]


def test_v2_split_grad_weight_launches_by_hand():
    """bf16 128×256 grad-weight of a 64→64 1×1 convolution over 4·32·32 pixels: one output tile,
    64 k-tiles, so the launcher splits the reduction 8 ways (two blocks per SM at most, each split
    8 k-tiles at least) and sums the fp32 partial tiles in a second launch."""
    shape = (4, 32, 32, 64, 64, 1, 1, 0)
    recorded, program = program_of("conv_v2", "wgrad", shape, tile="bf16_128x256", splits=8)
    (gemm, reduce), opt_ins = parse(program)
    smem = 4 * (128 + 256) * 64 * 2  # the 4 stages: over the epilogue's 128·(256·4 + 16) bytes
    name = f"conv_wgrad_v2<V2Tile<__nv_bfloat16, 128, 256, 64, 64, 64, 4, {smem}>, 0>"
    assert gemm == (name, (1, 1, 8), (256, 1, 1), smem,
                    ["(__nv_bfloat16*)buffers[0]", "(__nv_bfloat16*)buffers[1]", "(float*)buffers[2]",
                     *geometry_arguments(*shape), "nullptr", "nullptr", "nullptr", "4", "1"])
    assert reduce == ("splitk_reduce<float>", (16, 1, 1), (256, 1, 1), 0,  # 4096 sums, 256 threads a block
                      ["(float*)buffers[2]", "(float*)buffers[3]", "4096LL", "8"])
    assert opt_ins == {name: smem}
    assert BUFFER.findall(program) == [("x", "OPERAND_A", "BF16", str(4 * 32 * 32 * 64)),
                                       ("dy", "OPERAND_B", "BF16", str(4 * 32 * 32 * 64)),
                                       ("work0", "WORK", "F32", str(8 * 64 * 64)), ("dw", "OUTPUT", "F32", "4096")]
    assert recorded.plan.label() == "v2:bf16_128x256:8"


class Spy:
    """A kernel loader that records what the launcher launches and then runs it."""

    def __init__(self, load):
        self.load, self.launches = load, []

    def __call__(self, family):
        return SpyModule(self, self.load(family))


class SpyModule:
    def __init__(self, spy, module):
        self.spy, self.module = spy, module

    def get_function(self, name):
        return SpyFunction(self.spy, name, self.module.get_function(name))


class SpyFunction:
    def __init__(self, spy, name, function):
        self.spy, self.name, self.function = spy, name, function

    max_dynamic_shared_size_bytes = property(
        lambda self: self.function.max_dynamic_shared_size_bytes,
        lambda self, value: setattr(self.function, "max_dynamic_shared_size_bytes", value))

    def __call__(self, grid, block, args, shared_mem=0):
        written = ["buffer" if isinstance(a, numpy.ndarray) else "nullptr" if a.dtype == numpy.uint64 else
                   f"{int(a)}LL" if a.dtype == numpy.int64 else str(int(a)) for a in args]
        dims = [tuple(map(int, d)) + (1,) * (3 - len(d)) for d in (grid, block)]
        self.spy.launches.append((self.name, *dims, int(shared_mem), written))
        self.function(grid, block, args, shared_mem=shared_mem)


# every family in bf16 (channels a multiple of every tile's reduction step), then the other data
# types and a split of each tensor-core family
CASES = [(family, "bf16", (1, 5, 7, 64, 64, 3, 2, 1), {}, PASSES) for family in standalone.FAMILIES] + [
    ("conv_v1", "bf16", ODD, {}, PASSES), ("conv_v1", "tf32", ODD, {}, PASSES),
    ("conv_v1", "fp32", (1, 5, 6, 3, 8, 3, 2, 1), {}, PASSES),
    ("conv_v2", "tf32", (1, 5, 7, 32, 32, 3, 1, 1), {}, ("fwd", "dgrad")),  # TF32 grad-weight stays on v1
    ("conv_v2", "bf16", (2, 9, 9, 512, 64, 3, 2, 1), {"splits": 4}, ("fwd",)),
    ("conv_v3", "bf16", (2, 9, 9, 512, 64, 3, 2, 1), {"splits": 4}, ("fwd",))]


@pytest.mark.parametrize("family, dtype, shape, plan, passes", CASES,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_program_launches_what_the_launcher_launches(emulated, family, dtype, shape, plan, passes):
    """The launches written into the program are those the launcher makes when the same plan
    really runs, on the emulator."""
    n, h, w, c, k, r, stride, pad = shape
    element = BF16 if dtype == "bf16" else numpy.float32
    for conv_pass in passes:
        recorded, program = program_of(family, conv_pass, shape, dtype=dtype, **plan)
        spy = Spy(emulated_module)
        running = Kernels(spy, standalone.MULTIPROCESSORS, allow_tf32=dtype != "fp32")
        x, wt = numpy.zeros((n, h, w, c), element), numpy.zeros((k, r, r, c), element)
        dy = numpy.zeros((n, *recorded.geometry[7:9], k), element)
        {"fwd": lambda: running.conv_forward(x, wt, stride, pad, plan=recorded.plan),
         "dgrad": lambda: running.conv_grad_input(dy, wt, x.shape, stride, pad, plan=recorded.plan),
         "wgrad": lambda: running.conv_grad_weight(x, dy, wt.shape, stride, pad, plan=recorded.plan)}[conv_pass]()
        written, _ = parse(program)
        assert [(*launch[:4], ["buffer" if "buffers[" in a else a for a in launch[4]]) for launch in written] == \
            spy.launches, f"{family} {conv_pass}"


# ---- the host half of the program, compiled by g++ --------------------------------------------

@pytest.fixture(scope="module")
def gxx():
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found: the host half of the programs is compiled with it")
    return compiler


def host_program(gxx, folder, family, conv_pass, shape, dtype, check_macs=None):
    recorded, program = program_of(family, conv_pass, shape, dtype=dtype)
    source, binary = folder / "program.cu", folder / "host"
    source.write_text(program)
    budget = [f"-DSTANDALONE_CHECK_MACS={check_macs}"] if check_macs else []
    subprocess.run([gxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-DSTANDALONE_HOST_ONLY", *budget,
                    "-x", "c++", str(source), "-o", str(binary)], check=True, capture_output=True, timeout=120)
    return recorded, binary


def read_inputs(folder, recorded):
    """The program's inputs as float64 NHWC / KRSC arrays, and the float64 reference it wrote."""
    n, h, w, c, k, r, s, p, q = recorded.geometry[:9]
    shapes = {"x": (n, h, w, c), "w": (k, r, s, c), "dy": (n, p, q, k)}
    a_name, b_name = (b.name for b in recorded.buffers if b.role in ("OPERAND_A", "OPERAND_B"))
    element = BF16 if recorded.mode == "bf16" else numpy.float32

    def load(path, name):
        raw = numpy.fromfile(path, dtype=element).reshape(shapes[name])
        return (oracle.from_bf16(raw) if element == BF16 else raw).astype(numpy.float64)
    return load(folder / "a.bin", a_name), load(folder / "b.bin", b_name), numpy.fromfile(folder / "reference.bin")


def numpy_reference(recorded, a, b):
    stride, pad = recorded.geometry[9:]
    if recorded.conv_pass == "fwd":
        return conv_ref.correlate(a, b, stride, pad)
    n, h, w, c, k, r, s = recorded.geometry[:7]
    if recorded.conv_pass == "dgrad":
        return conv_ref.grad_input(a, b, (n, h, w, c), stride, pad)
    return conv_ref.grad_weight(a, b, numpy.empty((k, r, s, c)), stride, pad)


def checks(binary, folder, values, output):
    """(exit status, last line) of `binary check` on these output values, written in the output's type."""
    path = folder / "out.bin"
    (oracle.to_bf16(values) if output.array.dtype == BF16 else values.astype(numpy.float32)).tofile(path)
    result = subprocess.run([str(binary), "check", str(path)], capture_output=True, text=True, timeout=60)
    return result.returncode, result.stdout.strip()


@pytest.mark.parametrize("conv_pass", PASSES)
@pytest.mark.parametrize("dtype", ["bf16", "tf32"])
def test_host_reference_and_check(gxx, tmp_path, conv_pass, dtype):
    """The reference loop agrees with minidl.ops.conv in float64 on an odd shape, inputs as the
    kernel gets them (bf16 rounded); the check passes the reference rounded to the output's type
    and fails an output with one element off by 10% of the largest value, or one not written."""
    recorded, binary = host_program(gxx, tmp_path, "conv_v1", conv_pass, ODD, dtype)
    subprocess.run([str(binary), "write", str(tmp_path)], check=True, timeout=60)
    a, b, reference = read_inputs(tmp_path, recorded)
    expected = numpy_reference(recorded, a, b)
    assert numpy.abs(a).max() <= 1 and a.std() > 0.5, "inputs drawn uniformly from [-1, 1)"
    numpy.testing.assert_allclose(reference, expected.ravel(), rtol=0, atol=1e-12 * numpy.abs(expected).max())
    output = next(b for b in recorded.buffers if b.role == "OUTPUT")
    code, line = checks(binary, tmp_path, expected.ravel(), output)
    assert code == 0 and line.startswith("check: PASSED") and f"{expected.size} of {expected.size} elements" in line
    off = expected.ravel().copy()
    off[off.size // 3] += 0.1 * numpy.abs(expected).max()
    code, line = checks(binary, tmp_path, off, output)
    assert code == 1 and f"(element {off.size // 3})" in line, line
    unwritten = expected.ravel().copy()
    unwritten[-2] = numpy.nan
    code, line = checks(binary, tmp_path, unwritten, output)
    assert code == 1 and f"1 not written (NaN or inf; the first: element {unwritten.size - 2})" in line, line


def test_sampled_check(gxx, tmp_path):
    """Past its budget of multiply-adds the check compares a sample with the reference, always
    the first and the last element, and still finds an unwritten element anywhere."""
    recorded, binary = host_program(gxx, tmp_path, "conv_v1", "fwd", ODD, "tf32", check_macs=72 * 10)
    subprocess.run([str(binary), "write", str(tmp_path)], check=True, timeout=60)
    expected = numpy_reference(recorded, *read_inputs(tmp_path, recorded)[:2]).ravel()
    output = next(b for b in recorded.buffers if b.role == "OUTPUT")
    code, line = checks(binary, tmp_path, expected, output)
    assert code == 0 and f"10 of {expected.size} elements" in line, line  # 72 multiply-adds per element
    largest = numpy.abs(expected).max()
    for index, value in ((0, expected[0] + largest), (expected.size - 1, expected[-1] - largest),
                         (expected.size // 2, numpy.nan)):
        wrong = expected.copy()
        wrong[index] = value
        assert checks(binary, tmp_path, wrong, output)[0] == 1, index


# ---- nvcc ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_every_family_and_pass_builds(tmp_path):
    """nvcc compiles and links every family's program for each pass (bf16; the shared CUDA
    runtime), warnings as errors; the binary holds sm_90 code (v3's: sm_90a). It cannot run here."""
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (PATH, $CUDA_PATH/bin, /usr/local/cuda/bin)")
    jobs = []
    for family in standalone.FAMILIES:
        for conv_pass in PASSES:
            recorded, program = program_of(family, conv_pass, (2, 7, 5, 64, 64, 3, 2, 1))
            source = tmp_path / f"{recorded.stem()}.cu"
            source.write_text(program)
            command = standalone.build_command(nvcc, family, source, tmp_path / recorded.stem())
            jobs.append(command[:1] + ["--Werror", "all-warnings"] + command[1:])
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda c: subprocess.run(c, capture_output=True, text=True, timeout=300), jobs))
    for command, result in zip(jobs, results):
        assert result.returncode == 0, f"{' '.join(command)}:\n{result.stdout}{result.stderr}"
        binary = command[command.index("-o") + 1]
        arch = b"sm_90a" if "conv_v3" in binary else b"sm_90"
        assert arch in open(binary, "rb").read(), binary


# ---- the command line ---------------------------------------------------------------------------

def test_command_writes_the_program(tmp_path, capsys):
    assert bench_main(["standalone", "--family", "conv_v2", "--pass", "dgrad", "--shape", "1,5,7,64,64,3,2,1",
                       "--out", str(tmp_path)]) == 0
    (source,) = tmp_path.glob("*.cu")
    assert source.name == "conv_v2_dgrad_bf16_128x256_s1_1x5x7x64_k64r3s2p1.cu"
    text = source.read_text()
    assert '#include "conv_v2.cu"' in text and "#define SPLITK_THREADS 256" in text
    assert f"wrote {source}" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--shape", "1,5,7,64,64,3,1,1", "--dtype", "fp16"], "argument --dtype: invalid choice: 'fp16'"),
    (["--shape", "1,5,7,64"], "--shape '1,5,7,64': give N,H,W,C,K,R,STRIDE,PAD"),
    (["--shape", "1,2,2,64,64,5,1,0"], "does not fit a 2x2 input"),
    (["--shape", "1,5,7,64,64,3,1,1", "--tile", "bf16_64x64"], "offers v2:bf16_128x256:1, v2:bf16_256x128:1"),
    (["--shape", "1,5,7,3,64,3,1,1", "--dtype", "tf32"], "give --dtype fp32"),
    (["--shape", "1,5,7,12,64,3,1,1"], "multiples of 8"),
])
def test_command_errors_are_one_line(tmp_path, capsys, flags, message):
    assert bench_main(["standalone", "--family", "conv_v2", "--pass", "fwd", "--out", str(tmp_path), *flags]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error, error
    assert not list(tmp_path.glob("*.cu"))
