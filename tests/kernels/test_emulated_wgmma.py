"""The emulation of kernels/wgmma.cuh (emu/wgmma_emu.h) against the PTX ISA, on the kernels of
wgmma_selftest.cu: wgmma products from shared-memory images laid out by a NumPy model of the
ISA's canonical layouts (wgmma_layouts.py: CuTe shapes and strides, the Swizzle<B,4,3> XOR) against A·B,
the accumulator fragment map, the mbarrier phase walk and a cp.async pipeline on mbarriers, and
each misuse the emulation promises to report; and nvcc compiling the kernels for sm_90a."""
import json
import shutil
import subprocess
from pathlib import Path

import numpy
import pytest

import emulator
import ptx_selftest
import wgmma_layouts

SOURCE = str(ptx_selftest.WGMMA_SOURCE)
SHAPES = (8, 64, 128)
PRODUCTS, KERNELS = ptx_selftest.WGMMA_PRODUCTS, ptx_selftest.WGMMA_KERNELS
IMAGE_BYTES = 8192  # the misuse kernel's: A at 0, B at 2048
WARPGROUP = (128,)
rng = numpy.random.default_rng(32)


@pytest.fixture(scope="module")
def selftest():
    return emulator.load_for_test(SOURCE, KERNELS)


def run_product(selftest, n, trans_a, trans_b, swizzle_a, swizzle_b, rs=False, accumulate=0, repeats=1):
    """(d as the 64×N tile read through the ISA's fragment map, the expected tile)."""
    name, args, shared, want = wgmma_layouts.product_case(rng, n, trans_a, trans_b, swizzle_a, swizzle_b, rs,
                                                          accumulate, repeats)
    selftest.get_function(name)((1,), WARPGROUP, tuple(args), shared_mem=shared)
    return wgmma_layouts.tile_from_fragments(args[-1], n), want


def assert_close(got, want):
    numpy.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * numpy.abs(want).max())


@pytest.mark.parametrize("swizzle", [0, 1, 2, 3], ids=["none", "128B", "64B", "32B"])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True), (True, False), (True, True)],
                         ids=["K-K", "K-N", "M-K", "M-N"])
@pytest.mark.parametrize("n", SHAPES)
def test_wgmma_reads_the_isa_layouts_and_hands_out_the_isa_fragment(selftest, n, trans_a, trans_b, swizzle):
    got, want = run_product(selftest, n, trans_a, trans_b, swizzle, swizzle)
    assert_close(got, want)


def test_wgmma_chained_with_an_initial_accumulator(selftest):
    got, want = run_product(selftest, 64, False, True, 1, 3, accumulate=1, repeats=2)
    assert_close(got, want)


@pytest.mark.parametrize("trans_b", [False, True], ids=["K", "N"])
def test_wgmma_with_a_from_registers(selftest, trans_b):
    got, want = run_product(selftest, 64, False, trans_b, 0, 1, rs=True)
    assert_close(got, want)


def test_a_wrong_layout_gives_a_wrong_product(selftest, monkeypatch):
    """The oracle can fail: B laid out with 64B swizzle, the descriptor saying 128B."""
    real = wgmma_layouts.swizzle_address
    monkeypatch.setattr(wgmma_layouts, "swizzle_address", lambda address, s: real(address, 2 if s == 1 else s))
    got, want = run_product(selftest, 64, False, False, 1, 1)
    assert not numpy.allclose(got, want, atol=1e-3)


# ---- misuses --------------------------------------------------------------------------------------
def run_misuse(selftest, misuse):
    image = numpy.zeros(IMAGE_BYTES // 4, numpy.uint32) + numpy.uint32(0x3F803F80)  # bf16 ones
    d = numpy.zeros(128 * 4, numpy.float32)
    selftest.get_function("wgmma_misuse")((1,), WARPGROUP, (image, numpy.int32(image.size), numpy.int32(misuse), d),
                                          shared_mem=IMAGE_BYTES)
    return d


def test_a_correct_wgmma_is_not_reported(selftest):
    numpy.testing.assert_array_equal(run_misuse(selftest, 0), 16.0)  # sixteen products of ones


@pytest.mark.parametrize("misuse, message", [
    (1, r"^wgmma_misuse: WgmmaAccumulator: element 3 read while wgmma_bf16_ss \(this thread's wgmma #1\) on it is "
        r"pending .* \(block 0,0,0 thread 0,0,0\)"),
    (2, r"^wgmma_misuse: WgmmaAccumulator: element 1 written while wgmma_bf16_ss .* pending"),
    (3, r"^wgmma_misuse: wgmma_bf16_ss: issued without a wgmma_fence .*\(block 0,0,0 thread 0,0,0\)"),
    (4, r"^wgmma_misuse: wgmma_bf16_ss: operand A reads shared offset 0, written through the generic proxy"),
    (5, r"wgmma_fence: thread 127 did not execute it with the rest of the warpgroup"),
], ids=["read-before-wait", "write-before-wait", "missing-fence", "unfenced-store", "thread-exited"])
def test_wgmma_misuse_is_reported_with_kernel_thread_and_instruction(selftest, misuse, message):
    with pytest.raises(emulator.EmulationError, match=message):
        run_misuse(selftest, misuse)


# ---- mbarriers --------------------------------------------------------------------------------------
def test_mbarrier_phase_and_parity_walk(selftest):
    out = numpy.zeros(96, numpy.uint32)
    selftest.get_function("mbarrier_phases")((1,), (96,), (out,))
    per_round = [False, True, True]  # before the arrival: its phase open, the previous one complete; after: complete
    bits = per_round * 3
    expected = sum(int(b) << i for i, b in enumerate(bits))
    tx = sum(int(b) << (9 + i) for i, b in enumerate([False, False, True]))  # completes only at 64 bytes
    numpy.testing.assert_array_equal(out, [expected | tx] + [expected] * 95)


def run_pipeline(selftest, misuse, tiles=5):
    data = rng.integers(0, 1 << 31, tiles * 128, dtype=numpy.uint32)
    out = numpy.zeros_like(data)
    selftest.get_function("mbarrier_pipeline")((1,), (64,), (data, numpy.int32(tiles), numpy.int32(misuse), out))
    return data, out


def test_cp_async_pipeline_on_mbarriers_delivers_every_tile(selftest):
    data, out = run_pipeline(selftest, 0)
    want = numpy.roll(data.reshape(-1, 32, 4), -1, axis=1).reshape(-1)  # lane l shows lane l + 1's chunk
    numpy.testing.assert_array_equal(out, want)


def test_reading_a_stage_without_waiting_reads_poison(selftest):
    """The copies land when a thread polls their barrier: here only at the producer's tail."""
    _, out = run_pipeline(selftest, 1, tiles=2)
    assert (out == 0xFFFFFFFF).all()


def test_a_wait_nobody_completes_is_a_deadlock_not_a_hang(selftest):
    with pytest.raises(emulator.EmulationError, match=r"mbarrier deadlock: the wait for the phase of parity 0 of the "
                                                      r"mbarrier at a static __shared__ address never completes \(32 "
                                                      r"arrivals and 0 transaction bytes missing"):
        run_pipeline(selftest, 2)


# ---- setmaxnreg --------------------------------------------------------------------------------------
def test_setmaxnreg_moves_registers_between_warpgroups(selftest):
    out = numpy.zeros(256, numpy.uint32)
    selftest.get_function("register_budget")((1,), (256,), (numpy.int32(0), out))
    assert (out == 1).all()


@pytest.mark.parametrize("misuse, message", [
    (1, r"setmaxnreg_inc: thread \d+ did not execute it with the rest of the warpgroup"),
    (2, r"setmaxnreg_inc: 200 is below the warp's current 232 registers \(block 0,0,0 thread 128,0,0\)"),
    (3, r"setmaxnreg_inc: 236 registers; the count must be in \[24, 256\], a multiple of 8"),
], ids=["warps-disagree", "inc-below-current", "not-a-multiple-of-8"])
def test_bad_setmaxnreg_is_reported(selftest, misuse, message):
    with pytest.raises(emulator.EmulationError, match=message):
        selftest.get_function("register_budget")((1,), (256,), (numpy.int32(misuse), numpy.zeros(256, numpy.uint32)))


# ---- the hardware check's answers (ptx_selftest.py --suite wgmma --device gpu compares a GPU with them) --
def test_the_emulator_still_gives_the_committed_wgmma_answers(selftest):
    cases = json.loads(ptx_selftest.WGMMA_EXPECTED.read_text())["cases"]
    assert {c["kernel"] for c in cases} >= set(PRODUCTS[:4]) | {"mbarrier_phases", "mbarrier_pipeline"}
    for case in cases:
        assert ptx_selftest.run(selftest, numpy, case) == case["expected"], case["name"]


def test_the_wgmma_check_passes_on_the_emulator(tmp_path):
    assert ptx_selftest.main(["--json", str(tmp_path / "result.json"), "--device", "emulator", "--suite", "wgmma"]) == 0
    assert json.loads((tmp_path / "result.json").read_text())["passed"]


# ---- nvcc ------------------------------------------------------------------------------------------
@pytest.mark.slow  # 3 to 8 s of nvcc
def test_nvcc_compiles_the_selftest_for_sm_90a(tmp_path):
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if nvcc is None:
        pytest.skip("nvcc not found: the sm_90a compile check needs the CUDA toolkit")
    names = "\n".join(f"template __global__ void {k.split('<')[0]}<{k.split('<', 1)[1]}(const unsigned*, int, "
                      "const int*, const unsigned*, const float*, int, int, float*);" for k in PRODUCTS)
    unit = tmp_path / "unit.cu"
    unit.write_text(f'#include "{SOURCE}"\n{names}\n')
    result = subprocess.run([nvcc, "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-o", str(tmp_path / "unit.cubin"),
                             str(unit)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "error" not in result.stderr.lower()


def test_nvrtc_compiles_the_selftest_for_sm_90a():
    """The spelling CuPy's NVRTC path needs for wgmma: -arch=sm_90a (sm_90 rejects it)."""
    import test_nvrtc
    from minidl.kernels import loader
    library = test_nvrtc.find_libnvrtc()
    if library is None:
        pytest.skip("libnvrtc not found (CUDA toolkit or the nvidia-cuda-nvrtc wheel)")
    options = [*loader.compile_options({}), f"-I{Path(SOURCE).parent}", "-arch=sm_90a",
               "--device-as-default-execution-space", "-ftz=true"]
    ok, log, lowered = test_nvrtc.Nvrtc(library).compile(Path(SOURCE).read_text(), "wgmma_selftest.cu", options, KERNELS)
    assert ok, log[-4000:]
    assert set(lowered) == set(KERNELS)
