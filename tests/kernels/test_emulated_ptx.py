"""The emulation of kernels/ptx.cuh (emu/ptx_emu.h) against the PTX ISA, on the kernels of
ptx_selftest.cu: ldmatrix registers against the ISA's lane mapping computed here in NumPy, mma
results against NumPy products, the cp.async pipeline's deferred completion, and every misuse
the emulation promises to report."""
import json
import math
import re
import shutil
from fractions import Fraction

import numpy
import pytest

import emulator
import ptx_selftest

SELFTEST = str(ptx_selftest.SOURCE)
WARP = (32,)
rng = numpy.random.default_rng(7)


@pytest.fixture(scope="module")
def selftest():
    return emulator.load_for_test(SELFTEST, ptx_selftest.KERNELS)


# ---- ldmatrix -----------------------------------------------------------------------------------
def ldmatrix_expected(stored, matrices, trans):
    """registers[lane, i] by the PTX ISA: lane l holds row l/4, columns 2(l%4) and 2(l%4)+1 of
    matrix i (of its transpose with .trans), the lower column in the low 16 bits."""
    lane = numpy.arange(32)[:, None, None]  # axes: lane, matrix, half
    matrix, half = numpy.arange(matrices)[None, :, None], numpy.arange(2)[None, None, :]
    row, col = lane // 4, 2 * (lane % 4) + half
    if trans:
        row, col = col, row
    elements = stored[matrix, row, col].astype(numpy.uint32)
    return elements[..., 0] | elements[..., 1] << 16


def run_ldmatrix(selftest, matrices, trans, misuse=0, block=WARP):
    values = rng.permutation(1 << 16)[:32 * 8].astype(numpy.uint16)  # distinct 16-bit values
    slot_of_row = rng.permutation(32).astype(numpy.int32)  # rows scattered over shared memory
    out = numpy.zeros(32 * matrices, numpy.uint32)
    kernel = selftest.get_function(f"ldmatrix_rows<{matrices}, {str(trans).lower()}>")
    kernel((1,), block, (values.view(numpy.uint32), slot_of_row, numpy.int32(misuse), out))
    return values.reshape(4, 8, 8), out.reshape(32, matrices)


@pytest.mark.parametrize("trans", [False, True], ids=["plain", "trans"])
@pytest.mark.parametrize("matrices", [1, 2, 4])
def test_ldmatrix_hands_each_lane_the_isa_fragment(selftest, matrices, trans):
    stored, registers = run_ldmatrix(selftest, matrices, trans)
    numpy.testing.assert_array_equal(registers, ldmatrix_expected(stored, matrices, trans))


@pytest.mark.parametrize("misuse, block, message", [
    (1, WARP, "row address of lane 3 is null or not 16-byte aligned"),
    (2, WARP, "lane 31 did not execute it with the rest of the warp"),
    (0, (48,), "fewer than 32 threads"),
], ids=["misaligned-row", "lane-exited", "partial-warp"])
def test_ldmatrix_misuse_is_reported(selftest, misuse, block, message):
    with pytest.raises(emulator.EmulationError, match=message):
        run_ldmatrix(selftest, 4, False, misuse, block)


# ---- mma ------------------------------------------------------------------------------------------
def bf16(shape):
    """(bits, values): random bf16 numbers as uint16 bits and as float64."""
    bits = (rng.standard_normal(shape).astype(numpy.float32).view(numpy.uint32) >> 16).astype(numpy.uint16)
    return bits, (bits.astype(numpy.uint32) << 16).view(numpy.float32).astype(numpy.float64)


def tf32_truncated(x):  # what the unit reads of an fp32 operand
    return (x.view(numpy.uint32) & numpy.uint32(0xFFFFE000)).view(numpy.float32).astype(numpy.float64)


def tf32_rounded(x):
    """Round to nearest, ties away from zero, to 10 mantissa bits, in float64 arithmetic."""
    x = x.astype(numpy.float64)
    quantum = 2.0 ** (numpy.floor(numpy.log2(numpy.abs(x))) - 10)
    return numpy.sign(x) * numpy.floor(numpy.abs(x) / quantum + 0.5) * quantum


def operands(dtype, k_words):
    """(A words, Bᵀ words, A, B, C) for a 16×8 product over k_words 32-bit words per row (two bf16
    or one fp32 each): the words as the kernels take them, A and B as numbers."""
    c = rng.standard_normal((16, 8)).astype(numpy.float32)
    if dtype == "bf16":
        (a_bits, a), (bt_bits, bt) = bf16((16, 2 * k_words)), bf16((8, 2 * k_words))
        return a_bits.view(numpy.uint32), bt_bits.view(numpy.uint32), a, bt.T, c
    a, bt = (rng.standard_normal((rows, k_words)).astype(numpy.float32) for rows in (16, 8))
    return a.view(numpy.uint32), bt.view(numpy.uint32), a, bt.T, c


def product(kernel, dtype, k_words, *scalars, tf32=tf32_truncated):
    """(D, A·B + C in float64) from kernel(A words, Bᵀ words, C, D, *scalars) on fresh operands;
    `tf32` is what the TF32 unit gets of an fp32 operand."""
    a_words, bt_words, a, b, c = operands(dtype, k_words)
    d = numpy.zeros((16, 8), numpy.float32)
    kernel((1,), WARP, (a_words, bt_words, c, d, *scalars))
    if dtype == "tf32":
        a, b = tf32(a), tf32(b)
    return d, a @ b + c


def bf16_flag(dtype):  # the kernels' template argument BF16
    return str(dtype == "bf16").lower()


def mma_fragments(module, dtype):  # one mma: 8 words of k in both types
    return product(module.get_function(f"mma_fragments<{bf16_flag(dtype)}>"), dtype, 8)


@pytest.mark.parametrize("dtype", ["bf16", "tf32"])
def test_mma_with_isa_fragments_is_the_matrix_product(selftest, dtype):
    d, expected = mma_fragments(selftest, dtype)
    numpy.testing.assert_allclose(d, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["bf16", "tf32"])
def test_a_wrong_fragment_mapping_gives_a_wrong_product(dtype):
    """The same kernel with A's registers 1 and 2 swapped (-DPTX_SELFTEST_SWAP_A12): the
    emulation follows the registers, so the mistake shows as on a GPU."""
    if shutil.which(emulator.CXX) is None:
        pytest.skip(f"{emulator.CXX} not found")
    swapped = emulator.load(SELFTEST, ("mma_fragments<true>", "mma_fragments<false>"), (("PTX_SELFTEST_SWAP_A12", 1),))
    d, expected = mma_fragments(swapped, dtype)
    assert numpy.abs(d - expected).max() > 0.1


# ---- the pipeline: cp.async stages, ldmatrix, mma -------------------------------------------------
K_WORDS = 44  # 6 k-tiles of 8 words through 3 stages, the last one half zero-filled


def tile_gemm(module, dtype, late_wait=0):  # TF32 operands rounded by the kernel (cvt.rna)
    kernel = module.get_function(f"tile_gemm<{bf16_flag(dtype)}, {late_wait}>")
    return product(kernel, dtype, K_WORDS, numpy.int32(K_WORDS), tf32=tf32_rounded)


@pytest.mark.parametrize("dtype", ["bf16", "tf32"])
def test_pipelined_tile_from_swizzled_shared_memory(selftest, dtype):
    d, expected = tile_gemm(selftest, dtype)
    numpy.testing.assert_allclose(d, expected, rtol=1e-5, atol=1e-4)


def test_reading_a_stage_before_its_wait_reads_poison(selftest):
    """Waiting for one cp.async group too few: the k-tile is read before its copies land."""
    d, _ = tile_gemm(selftest, "bf16", late_wait=1)
    assert numpy.isnan(d).all()


def test_misaligned_async_copy_is_reported(selftest):
    a_words = numpy.zeros(16 * K_WORDS + 1, numpy.uint32)[1:]  # 4 bytes past a 16-byte boundary
    d = numpy.zeros((16, 8), numpy.float32)
    with pytest.raises(emulator.EmulationError, match="16-byte aligned"):
        selftest.get_function("tile_gemm<true, 0>")((1,), WARP, (a_words, numpy.zeros(8 * K_WORDS, numpy.uint32),
                                                                  numpy.zeros((16, 8), numpy.float32), d,
                                                                  numpy.int32(K_WORDS)))


# ---- cvt.rna.tf32.f32 -----------------------------------------------------------------------------
def test_tf32_bits_round_to_nearest_ties_away(selftest):
    ties = (numpy.array([0x3F801000, 0xBF801000, 0x3F803000, 0x3FFFF000], numpy.uint32)).view(numpy.float32)
    x = numpy.concatenate([ties, rng.standard_normal(200).astype(numpy.float32) * 1e3]).astype(numpy.float32)
    bits = numpy.zeros(x.size, numpy.uint32)
    selftest.get_function("round_tf32")((2,), (64,), (x, bits, numpy.int32(x.size)))
    numpy.testing.assert_array_equal(bits.view(numpy.float32).astype(numpy.float64), tf32_rounded(x))
    assert list(bits[:4]) == [0x3F802000, 0xBF802000, 0x3F804000, 0x40000000]


# ---- fma.rn.relu.bf16x2 ---------------------------------------------------------------------------
def bf16_value(bits):
    return Fraction(float(numpy.array([bits << 16], numpy.uint32).view(numpy.float32)[0]))


def bf16_fma_relu_exact(a, b, c):
    """The PTX ISA's fma.rn.relu on one bf16 half: a·b + c exactly, rounded once to nearest even
    (subnormals kept, infinite past the largest finite value), negative results +0."""
    v = bf16_value(a) * bf16_value(b) + bf16_value(c)
    if v <= 0:
        return 0
    exponent = math.floor(math.log2(v))
    while Fraction(2) ** exponent > v:  # log2 of a Fraction can be off by one at powers of two
        exponent -= 1
    while Fraction(2) ** (exponent + 1) <= v:
        exponent += 1
    ulp = Fraction(2) ** (max(exponent, -126) - 7)
    q = v / ulp
    whole = math.floor(q)
    if q - whole > Fraction(1, 2) or (q - whole == Fraction(1, 2) and whole % 2):
        whole += 1
    rounded = whole * ulp
    if rounded >= Fraction(2) ** 128:
        return 0x7F80
    return int(numpy.array([float(rounded)], numpy.float32).view(numpy.uint32)[0] >> 16)


def test_fma_relu_bf16x2_rounds_the_exact_sum_once(selftest):
    """Random operands, exact ties (even either way), ties decided by an addend below a double's
    precision (where a·b + c in doubles would round twice), subnormal and overflowing results,
    negative results and NaN, against the exact rational result."""
    ties = [(0x3F81, 0x3FC0, 0x0000),   # (1 + 2^-7)·1.5 = 1.1000001|1: a tie, to even (up)
            (0x3F81, 0x3FC0, 0x9DC0),   # − 1.5·2^-68 (far below a double's ulp): decides the tie down
            (0x3F83, 0x3FC0, 0x0000),   # (1 + 3·2^-7)·1.5: a tie whose even neighbour is below
            (0x3F83, 0x3FC0, 0x1DC0),   # + 1.5·2^-68: decides it up
            (0x0001, 0x3F00, 0x0000),   # the smallest subnormal halved: a tie to 0
            (0x0003, 0x3F00, 0x0000),   # 1.5 subnormal ulps: a tie to 2 ulps
            (0x7F7F, 0x4000, 0x0000),   # overflow: infinity
            (0x3F80, 0xBF80, 0x3F00),   # −1 + 0.5: negative, +0
            (0x7FC0, 0x3F80, 0x0000)]   # NaN
    pairs = [tuple(int(v) for v in rng.integers(0, 1 << 16, 3)) for _ in range(400)]
    for i, (a, b, c) in enumerate(pairs):  # keep the exponents moderate: products near 1, a few far
        if i % 4:
            pairs[i] = ((a & 0x807F) | 0x3F00, (b & 0x807F) | 0x3F80, (c & 0x80FF) | (0x3E00 + (i % 9) * 0x80))
    halves = ties + pairs
    if len(halves) % 2:
        halves.append((0x3F80, 0x3F80, 0x3F80))
    words = numpy.array(halves, numpy.uint32).reshape(-1, 2, 3)
    a, b, c = (words[:, 0, k] | words[:, 1, k] << 16 for k in range(3))
    d = numpy.zeros(len(a), numpy.uint32)
    selftest.get_function("fma_relu_pairs")((2,), (64,), (a, b, c, d, numpy.int32(len(a))))
    got = numpy.stack([d & 0xFFFF, d >> 16], axis=1).reshape(-1)
    for (x, y, z), result in zip(halves, got):
        if (x & 0x7FFF) > 0x7F80 or (y & 0x7FFF) > 0x7F80 or (z & 0x7FFF) > 0x7F80:
            assert result == 0x7FFF, f"NaN operand: canonical NaN, got {result:#06x}"
            continue
        if any((v & 0x7FFF) == 0x7F80 for v in (x, y, z)):
            continue  # infinite operands: covered by the overflow case's result only
        assert result == bf16_fma_relu_exact(x, y, z), f"fma.rn.relu({x:#06x}, {y:#06x}, {z:#06x}) = {result:#06x}"
    assert list(got[:len(ties)]) == [0x3FC2, 0x3FC1, 0x3FC4, 0x3FC5, 0x0000, 0x0002, 0x7F80, 0x0000, 0x7FFF]


# ---- shared-memory bounds -------------------------------------------------------------------------
@pytest.mark.parametrize("plain", [False, True], ids=["ld.shared", "plain-c++"])
def test_a_shared_read_past_the_allocation_names_the_kernel_thread_and_offset(selftest, plain):
    """Through the PTX wrapper (checked) or plain C++ (a multiple of 256 bytes ends at a page
    boundary, and the guard page after it faults)."""
    name = f"shared_words<{str(plain).lower()}>"
    kernel, out = selftest.get_function(name), numpy.zeros(32, numpy.uint32)
    kernel((1,), WARP, (numpy.int32(128), numpy.int32(256), out), shared_mem=256)  # the last word: inside
    numpy.testing.assert_array_equal(out, 3 * numpy.arange(32, 64))
    how = "a plain C\\+\\+ access.*1 bytes" if plain else "lds_32: shared-memory access of 4 bytes"
    with pytest.raises(emulator.EmulationError, match=rf"^{re.escape(name)}: {how} at offset 256 outside .*"
                                                      r"\(block 0,0,0 thread 31,0,0\)"):
        kernel((1,), WARP, (numpy.int32(132), numpy.int32(256), out), shared_mem=256)  # lane 31 reads 256..259
    kernel((1,), WARP, (numpy.int32(0), numpy.int32(128), out), shared_mem=128)  # the launch after: unharmed
    numpy.testing.assert_array_equal(out, 3 * numpy.arange(32))
    if not plain:  # below the start: in the allocation's first page, which a guard page cannot cover
        with pytest.raises(emulator.EmulationError, match="at offset -4 outside"):
            kernel((1,), WARP, (numpy.int32(-4), numpy.int32(128), out), shared_mem=128)


# ---- the hardware check's answers (ptx_selftest.py --device gpu compares a GPU with them) -----------
def test_the_emulator_still_gives_the_committed_answers(selftest):
    cases = json.loads(ptx_selftest.EXPECTED.read_text())["cases"]
    assert {c["kernel"] for c in cases} >= set(ptx_selftest.LDMATRIX) | {"round_tf32", "fma_relu_pairs"}
    for case in cases:
        assert ptx_selftest.run(selftest, numpy, case) == case["expected"], case["name"]


def test_the_check_records_every_case_a_mismatch_and_an_error(selftest, tmp_path, monkeypatch):
    result = tmp_path / "result.json"
    assert ptx_selftest.check("emulator", result)
    written = json.loads(result.read_text())
    assert written["passed"] and written["device"] == "emulator"
    assert all(c["status"] == "passed" and c["mismatches"] == 0 for c in written["cases"])
    cases = json.loads(ptx_selftest.EXPECTED.read_text())
    cases["cases"][0]["expected"][0][5] ^= 1  # one bit of one answer
    tampered = tmp_path / "expected.json"
    tampered.write_text(json.dumps(cases))
    monkeypatch.setattr(ptx_selftest, "EXPECTED", tampered)
    assert not ptx_selftest.check("emulator", result)
    first = json.loads(result.read_text())["cases"][0]
    assert first["status"] == "failed" and first["mismatches"] == 1 and "word 5" in first["first_mismatch"]
    subnormal = next(c for c in cases["cases"] if c["name"] == "mma_fragments<true> subnormal")
    cases["cases"][0]["expected"][0][5] ^= 1
    subnormal["expected"][0][0] ^= 0x40000000  # the tensor cores would flush them: informational
    tampered.write_text(json.dumps(cases))
    assert ptx_selftest.check("emulator", result)
    recorded = {c["name"]: c for c in json.loads(result.read_text())["cases"]}["mma_fragments<true> subnormal"]
    assert recorded["status"] == "failed" and recorded["informational"]
    monkeypatch.setattr(ptx_selftest, "EXPECTED", tmp_path / "missing.json")
    assert not ptx_selftest.check("emulator", result)
    assert "missing.json" in json.loads(result.read_text())["error"]
