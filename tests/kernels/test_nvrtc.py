"""Every kernels/*.cu compiles with NVRTC, the compiler CuPy's RawModule uses on a GPU, with
minidl.kernels' options plus the ones CuPy adds, for sm_90: no warnings, every kernel name
expression resolves, and ptxas (asked for its report) finds no spills with these exact options.
So does ptx_selftest.cu: kernels/ptx.cuh is NVRTC-clean.
NVRTC needs no GPU, only its library (libnvrtc): from the CUDA toolkit, or the
`nvidia-cuda-nvrtc` wheel; the test skips, saying so, where neither is installed."""
import ctypes
import ctypes.util
import glob
import os
import sys

import pytest

import ptx_selftest
from minidl.bench._nvcc import parse_ptxas
from minidl.kernels import FAMILIES, loader

CUPY_ADDS = ("-arch=sm_90", "--device-as-default-execution-space", "-ftz=true")
REPORT = ("--ptxas-options=-v",)


def find_libnvrtc():
    patterns = [os.path.join(os.environ.get("CUDA_PATH", "/usr/local/cuda"), "lib64", "libnvrtc.so*"),
                "/usr/local/cuda/lib64/libnvrtc.so*"]
    patterns += [os.path.join(p, "nvidia", "*", "lib", "libnvrtc.so*") for p in sys.path if p]
    found = [f for p in patterns for f in sorted(glob.glob(p)) if "builtins" not in f and ".alt." not in f]
    found.append(ctypes.util.find_library("nvrtc"))
    for candidate in filter(None, found):
        # NVRTC opens its builtins library by name: load it from the same place first
        for builtins in sorted(glob.glob(os.path.join(os.path.dirname(candidate), "libnvrtc-builtins.so*"))):
            if ".alt." not in builtins:
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                break
        try:
            return ctypes.CDLL(candidate)
        except OSError:
            continue
    return None


class Nvrtc:
    def __init__(self, lib):
        self.lib = lib
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def check(self, status, what):
        if status != 0:
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(status).decode()}")

    def compile(self, source, name, options, expressions):
        """(success, log, {expression: lowered name})"""
        lib, program = self.lib, ctypes.c_void_p()
        self.check(lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None),
                   "nvrtcCreateProgram")
        try:
            for expression in expressions:
                self.check(lib.nvrtcAddNameExpression(program, expression.encode()), "nvrtcAddNameExpression")
            encoded = [o.encode() for o in options]
            status = lib.nvrtcCompileProgram(program, len(encoded), (ctypes.c_char_p * len(encoded))(*encoded))
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(program, log)
            lowered = {}
            if status == 0:
                for expression in expressions:
                    mangled = ctypes.c_char_p()
                    self.check(lib.nvrtcGetLoweredName(program, expression.encode(), ctypes.byref(mangled)),
                               f"nvrtcGetLoweredName({expression})")
                    lowered[expression] = mangled.value.decode()
            return status == 0, log.value.decode(errors="replace"), lowered
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(program))


@pytest.fixture(scope="module")
def nvrtc():
    lib = find_libnvrtc()
    if lib is None:
        pytest.skip("libnvrtc not found (CUDA toolkit lib64, or `pip install nvidia-cuda-nvrtc`): "
                    "the NVRTC compile check needs it, not a GPU")
    return Nvrtc(lib)


SOURCES = {family: (loader.source_path(family), m.NAMES, m.DEFINES) for family, m in FAMILIES.items()}
SOURCES["ptx_selftest"] = (ptx_selftest.SOURCE, ptx_selftest.KERNELS, {})


@pytest.mark.parametrize("family", list(SOURCES))
def test_compiles_with_nvrtc(nvrtc, family):
    path, names, defines = SOURCES[family]
    arch = loader.required_arch(FAMILIES[family]) if family in FAMILIES else None
    options = loader.compile_options(defines, family if family in FAMILIES else None, arch) + CUPY_ADDS + REPORT
    # named by its path, the program finds its quoted includes next to it (CuPy's, by the -I of
    # loader.compile_options)
    ok, log, lowered = nvrtc.compile(path.read_text(), str(path), options, names)
    assert ok, f"NVRTC failed on {path.name} with {options}:\n{log}"
    compiler_lines = [line for line in log.splitlines() if not line.startswith("ptxas")]
    assert not any("warning" in line.lower() for line in compiler_lines), f"NVRTC warnings on {path.name}:\n{log}"
    assert set(lowered) == set(names) and all(lowered.values())
    resources = parse_ptxas(log)
    assert set(resources) == set(lowered.values()), "ptxas reported other kernels than the name expressions"
    for mangled, r in resources.items():
        assert r["spill_store_bytes"] == r["spill_load_bytes"] == r["stack_bytes"] == 0, f"{mangled} spills: {r}"


# wgmma and setmaxnreg exist on sm_90a only (PTX ISA: "requires sm_90a")
WGMMA_KERNEL = r"""
extern "C" __global__ void wgmma_probe(float* out, unsigned long long a, unsigned long long b) {
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    asm volatile("wgmma.fence.sync.aligned;\n");
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(a), "l"(b));
    asm volatile("wgmma.commit_group.sync.aligned;\n");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    for (int i = 0; i < 4; ++i) out[threadIdx.x * 4 + i] = d[i];
}
"""


def test_the_sm_90a_spelling_compiles_wgmma_after_cupys_own_arch(nvrtc):
    """loader's options for sm_90a, then CuPy's -arch=sm_90 of the device: NVRTC builds sm_90a
    and wgmma compiles; CuPy's option alone (the family's arch not declared) fails in ptxas."""
    ok, log, _ = nvrtc.compile(WGMMA_KERNEL, "probe.cu", loader.compile_options({}, arch=loader.SM_90A) + CUPY_ADDS, [])
    assert ok, log
    ok, log, _ = nvrtc.compile(WGMMA_KERNEL, "probe.cu", loader.compile_options({}) + CUPY_ADDS, [])
    assert not ok and "not supported on .target 'sm_90'" in log, log


@pytest.mark.parametrize("arch, capability, why", [
    (None, "80", None), ("sm_90a", None, None), ("sm_90a", "90", None), ("sm_80", "90", None),
    ("sm_90a", "80", "needs sm_90a (compute capability 9.0 exactly); this GPU is 8.0"),
    ("sm_90a", "100", "needs sm_90a (compute capability 9.0 exactly); this GPU is 10.0"),
    ("sm_90", "86", "needs sm_90 (compute capability 9.0 or later); this GPU is 8.6")])
def test_which_device_runs_which_arch(arch, capability, why):
    assert loader.unavailable(arch, capability) == why
