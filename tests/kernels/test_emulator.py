"""The CPU emulator itself (emu/cuda_emu.h, emulator.py), on the small kernels of
emu_selftest.cu whose results NumPy predicts: every CUDA feature the real kernels rely on,
and every misuse the harness promises to catch."""
import time
from pathlib import Path

import numpy
import pytest

import emulator

SELFTEST = str(Path(__file__).resolve().parent / "emu_selftest.cu")
NAMES = ("block_sum", "reverse_blocks", "early_exit", "shuffles", "wmma_tf32", "wmma_misaligned")


@pytest.fixture(scope="module")
def selftest(emulated):  # `emulated` skips where there is no compiler
    started = time.perf_counter()
    module = emulator.load(SELFTEST, NAMES)
    print(f"\nemu_selftest.cu: loaded (compiled if the cache was cold) in {time.perf_counter() - started:.2f} s")
    return module


def test_shared_memory_shuffles_and_atomics(selftest):
    """docs/design.md §3's benchmark: a 5-block × 96-thread reduction (static shared memory, warp
    shuffles, __syncthreads, an atomic); a 470-element input leaves the last block partial."""
    x = numpy.arange(470, dtype=numpy.float32)
    block_sums, total = numpy.zeros(5, numpy.float32), numpy.zeros(1, numpy.float32)
    started = time.perf_counter()
    selftest.get_function("block_sum")((5,), (96,), (x, numpy.int32(470), block_sums, total))
    print(f"\n5 blocks x 96 threads: {1e3 * (time.perf_counter() - started):.0f} ms")
    expected = numpy.add.reduceat(x.astype(numpy.float64), numpy.arange(0, 470, 96))
    numpy.testing.assert_array_equal(block_sums, expected)
    assert total[0] == expected.sum()


def test_dynamic_shared_memory(selftest):
    x = numpy.arange(3 * 64, dtype=numpy.int32)
    y = numpy.empty_like(x)
    selftest.get_function("reverse_blocks")((3,), (64,), (x, y), shared_mem=64 * 4)
    numpy.testing.assert_array_equal(y, x.reshape(3, 64)[:, ::-1].reshape(-1))


def test_dynamic_shared_memory_over_48k_needs_the_opt_in(selftest):
    x = numpy.arange(64, dtype=numpy.int32)
    y = numpy.empty_like(x)
    kernel = selftest.get_function("reverse_blocks")
    with pytest.raises(emulator.EmulationError, match="max_dynamic_shared_size_bytes"):
        kernel((1,), (64,), (x, y), shared_mem=60 * 1024)
    kernel.max_dynamic_shared_size_bytes = 60 * 1024
    kernel((1,), (64,), (x, y), shared_mem=60 * 1024)
    numpy.testing.assert_array_equal(y, x[::-1])


def test_threads_that_return_early_leave_the_barrier(selftest):
    x = numpy.arange(128, dtype=numpy.float32)
    y = numpy.full(128, -1, numpy.float32)
    selftest.get_function("early_exit")((1,), (128,), (x, numpy.int32(40), y))
    numpy.testing.assert_array_equal(y[:40], numpy.roll(x[:40], -1))
    assert (y[40:] == -1).all()


def test_shuffle_flavours_on_a_2d_block(selftest):
    block = (16, 4)  # 64 threads: two warps, lanes numbered x fastest
    x = numpy.random.default_rng(0).integers(0, 1000, 64).astype(numpy.int32)
    out = numpy.empty(6 * 64, numpy.int32)
    selftest.get_function("shuffles")((1,), block, (x, out))
    out = out.reshape(64, 6)
    for t in range(64):
        warp, lane = divmod(t, 32)
        v = x[warp * 32:(warp + 1) * 32]
        ballot = sum(1 << i for i in range(32) if v[i] % 2)
        expected = [v[3], v[lane ^ 5], v[lane + 2] if lane + 2 < 32 else v[lane],
                    v[lane - 1] if lane >= 1 else v[lane], v[(lane & ~7) + 1], numpy.int32(numpy.uint32(ballot))]
        assert list(out[t]) == expected, f"thread {t}"


def tf32(values, round_to_nearest):
    bits = values.astype(numpy.float32).view(numpy.uint32)
    if round_to_nearest:  # cvt.rna.tf32.f32
        bits = bits + numpy.uint32(0x1000)
    return (bits & numpy.uint32(0xFFFFE000)).view(numpy.float32).astype(numpy.float64)


@pytest.mark.parametrize("round_inputs", [1, 0])
def test_wmma_tf32_fragments(selftest, round_inputs):
    """A 16×8 by 8×16 product on emulated TF32 tensor cores: operands keep 10 mantissa bits,
    rounded by __float_to_tf32 or, without it, cut as the hardware cuts them."""
    rng = numpy.random.default_rng(1)
    a = rng.standard_normal((16, 8)).astype(numpy.float32)
    b = rng.standard_normal((16, 8)).astype(numpy.float32)  # column-major 8×16: row j is column j
    d = numpy.empty((16, 16), numpy.float32)
    selftest.get_function("wmma_tf32")((1,), (32,), (a, b, d, numpy.int32(round_inputs)))
    expected = tf32(a, round_inputs) @ tf32(b, round_inputs).T
    numpy.testing.assert_allclose(d, expected, rtol=1e-6, atol=1e-6)
    assert not numpy.allclose(d, a.astype(numpy.float64) @ b.T, rtol=1e-6, atol=0), "TF32 must lose precision"


def test_wmma_alignment_rule_is_enforced(selftest):
    a, d = numpy.zeros(16 * 16 + 8, numpy.float32), numpy.zeros(256, numpy.float32)
    with pytest.raises(emulator.EmulationError, match="256-bit aligned"):
        selftest.get_function("wmma_misaligned")((1,), (32,), (a, d))


def test_arguments_are_checked_like_cupy_would_need_them(selftest):
    kernel = selftest.get_function("block_sum")
    x, sums, total = numpy.zeros(96, numpy.float32), numpy.zeros(1, numpy.float32), numpy.zeros(1, numpy.float32)
    with pytest.raises(TypeError, match="64-bit"):
        kernel((1,), (96,), (x, 96, sums, total))  # a Python int
    with pytest.raises(TypeError, match="dtype"):
        kernel((1,), (96,), (x.astype(numpy.float64), numpy.int32(96), sums, total))
    with pytest.raises(TypeError, match="uint64"):
        kernel((1,), (96,), (x, numpy.int32(96), None, total))
    with pytest.raises(TypeError, match="contiguous"):
        kernel((1,), (96,), (numpy.zeros(192, numpy.float32)[::2], numpy.int32(96), sums, total))


def test_out_of_bounds_accesses_are_caught(selftest):
    x = numpy.arange(128, dtype=numpy.int32)
    with pytest.raises(emulator.EmulationError, match="outside an argument"):
        selftest.get_function("reverse_blocks")((2,), (64,), (x, numpy.empty(100, numpy.int32)), shared_mem=256)
    sums, total = numpy.zeros(2, numpy.float32), numpy.zeros(1, numpy.float32)
    selftest.get_function("block_sum")((2,), (96,), (numpy.ones(150, numpy.float32), numpy.int32(192), sums, total))
    assert numpy.isnan(sums[1]), "a read past the end must poison the result"
