"""The emulation of kernels/wgmma.cuh (emu/wgmma_emu.h) against the PTX ISA, on the kernels of
wgmma_selftest.cu: wgmma products from shared-memory images laid out here by a NumPy model of the
ISA's canonical layouts (CuTe shapes and strides, the Swizzle<B,4,3> XOR) against A·B in NumPy,
the accumulator fragment map, the mbarrier phase walk and a cp.async pipeline on mbarriers, and
each misuse the emulation promises to report; and nvcc compiling the kernels for sm_90a."""
import shutil
import sys
import subprocess
from pathlib import Path

import numpy
import pytest

import emulator

SOURCE = str(Path(__file__).resolve().parent / "wgmma_selftest.cu")
SHAPES = (8, 64, 128)
PRODUCTS = tuple(f"wgmma_product<{n}, {ta}, {tb}, false>" for n in SHAPES for ta in ("false", "true")
                 for tb in ("false", "true")) + tuple(f"wgmma_product<64, false, {tb}, true>" for tb in ("false", "true"))
KERNELS = PRODUCTS + ("wgmma_misuse", "mbarrier_phases", "mbarrier_pipeline", "register_budget")
SWIZZLE_BYTES = {0: 16, 1: 128, 2: 64, 3: 32}  # the descriptor's mode: its row bytes W (16: no swizzle)
SWIZZLE_BITS = {0: 0, 1: 3, 2: 2, 3: 1}
B_AT = 8192  # B's region in the image (1024-byte aligned), A's at 0
IMAGE_BYTES = 24576
WARPGROUP = (128,)
rng = numpy.random.default_rng(32)


@pytest.fixture(scope="module")
def selftest():
    return emulator.load_for_test(SOURCE, KERNELS)


# ---- the ISA's shared-memory layouts as CuTe layouts ------------------------------------------------
def cute_offset(coordinate, shape, stride):
    """A CuTe layout's value at a 1-D coordinate of one mode: colexicographic over the sub-shape."""
    offset = 0
    for extent, step in zip(shape, stride):
        offset += (coordinate % extent) * step
        coordinate //= extent
    return offset


def canonical(mn_major, swizzle, leading, stride):
    """((mn shape), (mn stride)), ((k shape), (k stride)) in bf16 elements, from the ISA's table
    "Canonical Layouts" (T = 8 elements per 16 bytes; LBO, SBO given in bytes)."""
    t, lbo, sbo, repeat = 8, leading // 2, stride // 2, 1 << 20
    if mn_major:
        if swizzle == 0:
            return ((t, 1, repeat), (1, t, sbo)), ((8, repeat), (t, lbo))
        w = SWIZZLE_BYTES[swizzle] // 16
        return ((t, w, repeat), (1, t, lbo)), ((8, repeat), (w * t, sbo))
    if swizzle == 0:
        return ((8, repeat), (t, sbo)), ((t, repeat), (1, lbo))
    w = SWIZZLE_BYTES[swizzle] // 16
    return ((8, repeat), (w * t, sbo)), ((t, repeat), (1, t))


def swizzle_address(address, swizzle):
    """CuTe's Swizzle<B, 4, 3> on a byte address: bits [7, 7+B) XORed into bits [4, 4+B)."""
    bits = SWIZZLE_BITS[swizzle]
    return address ^ (((address >> 7) & ((1 << bits) - 1)) << 4)


def place(image, start, matrix, mn_major, swizzle, leading, stride, k_first=0):
    """Writes matrix[mn, k] (bf16 bits) into the image (bytes) where the wgmma reads element
    (mn, k) of an operand whose descriptor starts at `start`; k_first: the k-slice sits at columns
    k_first.. of a wider K-major tile, the descriptor's start moved by as many bytes."""
    (mn_shape, mn_stride), (k_shape, k_stride) = canonical(mn_major, swizzle, leading, stride)
    base = start - 2 * k_first
    for mn in range(matrix.shape[0]):
        for k in range(16):
            element = cute_offset(mn, mn_shape, mn_stride) + cute_offset(k + k_first, k_shape, k_stride)
            at = swizzle_address(base + 2 * element, swizzle)
            image[at:at + 2] = numpy.frombuffer(matrix[mn, k].tobytes(), numpy.uint8)


def layout_for(mn_major, swizzle, mn_size):
    """(leading, stride) byte offsets that pack an operand of mn_size × 16 densely."""
    if swizzle == 0:
        return (128 * (mn_size // 8), 128) if mn_major else (128, 256)
    w = SWIZZLE_BYTES[swizzle]
    if mn_major:
        return 8 * w, 8 * w * max(1, 2 * mn_size // w)  # LBO: the next W/2 columns of mn; SBO: the next 8 k
    return 16, 8 * w  # K-major: LBO unused (1 encoded), SBO: the next 8 rows


def fragment_rc(n):
    """(row, col) of register i of thread t of the 64×N accumulator, by the ISA's figure."""
    t, i = numpy.arange(128)[:, None], numpy.arange(n // 2)[None, :]
    return 16 * (t // 32) + (t % 32) // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (t % 4) + i % 2


def bf16(shape):
    bits = (rng.standard_normal(shape).astype(numpy.float32).view(numpy.uint32) >> 16).astype(numpy.uint16)
    return bits, (bits.astype(numpy.uint32) << 16).view(numpy.float32).astype(numpy.float64)


def run_product(selftest, n, trans_a, trans_b, swizzle_a, swizzle_b, rs=False, accumulate=0, repeats=1):
    """(d as the 64×N tile read through the fragment map, the expected tile)."""
    a_bits, a = bf16((64, 16))
    b_bits, b = bf16((n, 16))  # B stored as (n, k)
    image = rng.integers(0, 256, IMAGE_BYTES, dtype=numpy.uint8)  # garbage where no operand lies
    k_first_a = 16 if not trans_a and swizzle_a in (1, 2) else 0  # the second k-slice of a wider tile
    k_first_b = 16 if not trans_b and swizzle_b in (1, 2) else 0
    la, lb = layout_for(trans_a, swizzle_a, 64), layout_for(trans_b, swizzle_b, n)
    start_a, start_b = 2 * k_first_a, B_AT + 2 * k_first_b
    if not rs:
        place(image, start_a, a_bits, trans_a, swizzle_a, *la, k_first_a)
    place(image, start_b, b_bits, trans_b, swizzle_b, *lb, k_first_b)
    layout = numpy.array([start_a, *la, swizzle_a, start_b, *lb, swizzle_b], numpy.int32)
    a_words = numpy.ascontiguousarray(a_bits).view(numpy.uint32)
    c = rng.standard_normal(128 * n // 2).astype(numpy.float32)
    d = numpy.zeros_like(c)
    kernel = selftest.get_function(f"wgmma_product<{n}, {str(trans_a).lower()}, {str(trans_b).lower()}, "
                                   f"{str(rs).lower()}>")
    kernel((1,), WARPGROUP, (image.view(numpy.uint32), numpy.int32(IMAGE_BYTES // 4), layout, a_words, c,
                             numpy.int32(accumulate), numpy.int32(repeats), d), shared_mem=IMAGE_BYTES)
    rows, cols = fragment_rc(n)
    tile, initial = numpy.zeros((64, n)), numpy.zeros((64, n))
    tile[rows, cols] = d.reshape(128, n // 2)
    initial[rows, cols] = c.reshape(128, n // 2)
    return tile, initial * accumulate + repeats * (a @ b.T)


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
    real = swizzle_address
    monkeypatch.setattr(sys.modules[__name__], "swizzle_address", lambda address, s: real(address, 2 if s == 1 else s))
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


# ---- nvcc ------------------------------------------------------------------------------------------
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
