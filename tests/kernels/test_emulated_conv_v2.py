"""The v2 convolution kernels (kernels/conv_v2.cu) on the CPU emulator: every tile and pass
against the float64 reference of minidl.ops.conv, on shapes that divide no tile (batch 1, odd
spatial sizes, channels past a tile's edge), strides 1 and 2, 1×1 and 3×3 filters, split-K; the
plans the launcher offers per shape; the autotuner's choice, its cache and what it reports;
misaligned operands copied.

The emulator runs mma.sync, ldmatrix and cp.async with the PTX ISA's lane mappings and the
copies' late arrival (tests/kernels/emu/ptx_emu.h), so a wrong fragment layout, swizzle or
pipeline wait shows here as a wrong result."""
import itertools
import json

import numpy
import pytest

import oracle
from minidl.kernels import Kernels, canary, conv_v2
from minidl.kernels.autotune import Autotuner, Plan
from minidl.ops import conv as conv_ref

# (n, h, w, c, k, r, stride, padding) per pass: the reduction's channels a multiple of BK (64
# for bf16, 32 for TF32), the product's other edge not a multiple of any tile
SHAPES = {
    "bf16": {"conv_fwd": [(1, 5, 7, 64, 72, 3, 1, 1), (2, 6, 5, 128, 64, 1, 2, 0), (2, 7, 6, 64, 64, 3, 2, 1)],
             "conv_dgrad": [(1, 5, 7, 72, 64, 3, 1, 1), (2, 6, 5, 64, 128, 1, 2, 0), (2, 7, 6, 64, 64, 3, 2, 1)],
             "conv_wgrad": [(1, 5, 7, 72, 40, 3, 1, 1), (2, 6, 5, 64, 128, 1, 2, 0), (2, 7, 6, 64, 64, 3, 2, 1)]},
    "tf32": {"conv_fwd": [(1, 5, 7, 32, 36, 3, 1, 1), (2, 7, 6, 64, 32, 3, 2, 1)],
             "conv_dgrad": [(1, 5, 7, 36, 32, 3, 1, 1), (2, 7, 6, 32, 64, 3, 2, 1)]},
}
CASES = [(tile.name, conv_pass, shape) for tile in conv_v2.TILES.values()
         for mode in ("bf16" if tile.dtype.itemsize == 2 else "tf32",)
         for conv_pass, shapes in SHAPES[mode].items() if tile.serves(conv_pass) for shape in shapes]


def mode_of(tile):
    return "bf16" if conv_v2.TILES[tile].dtype.itemsize == 2 else "tf32"


def run_pass(kernels, mode, conv_pass, shape, plan=None, seed=0):
    """(kernel result, float64 reference) of one pass on random data."""
    n, h, w, c, k, r, stride, padding = shape
    data = oracle.Inputs(numpy, mode, seed)
    x, wt = data.normal((n, h, w, c)), data.normal((k, r, r, c), scale=(r * r * c) ** -0.5)
    x64, w64 = data.reference(x), data.reference(wt)
    y64 = conv_ref.correlate(x64, w64, stride, padding)
    gy = data.normal(y64.shape)
    if conv_pass == "conv_fwd":
        return data.result(kernels.conv_forward(data.kernel(x), data.kernel(wt), stride, padding, plan=plan)), y64
    if conv_pass == "conv_dgrad":
        ours = kernels.conv_grad_input(data.kernel(gy), data.kernel(wt), x.shape, stride, padding, plan=plan)
        return data.result(ours), conv_ref.grad_input(data.reference(gy), w64, x.shape, stride, padding)
    ours = kernels.conv_grad_weight(data.kernel(x), data.kernel(gy), wt.shape, stride, padding, plan=plan)
    return ours, conv_ref.grad_weight(x64, data.reference(gy), w64, stride, padding)


@pytest.mark.parametrize("tile, conv_pass, shape", CASES, ids=[f"{t}-{p}-{'x'.join(map(str, s))}" for t, p, s in CASES])
def test_v2_tile_against_the_reference(emulated, tile, conv_pass, shape):
    mode = mode_of(tile)
    geometry = (*shape[:5], shape[5], shape[5], 0, 0, shape[6], shape[7])
    assert conv_v2.TILES[tile].fits(conv_pass, conv_v2.TILES[tile].dtype, geometry), "the case must be one the tile serves"
    ours, reference = run_pass(emulated, mode, conv_pass, shape, Plan("v2", tile))
    oracle.assert_close(ours, reference, oracle.TOLERANCE[mode], f"{tile} {conv_pass} {shape}")


@pytest.mark.parametrize("conv_pass, shape", [(p, s[-1]) for p, s in SHAPES["bf16"].items()])
def test_split_reductions_sum_in_order(emulated, conv_pass, shape):
    """Three splits of the reduction (fp32 partial tiles, then splitk_reduce): the same result."""
    ours, reference = run_pass(emulated, "bf16", conv_pass, shape, Plan("v2", "bf16_128x128", 3))
    oracle.assert_close(ours, reference, oracle.TOLERANCE["bf16"], f"3 splits {conv_pass}")


def test_the_plans_of_a_shape(emulated):
    """v1 first (the kernel without a tuner), then every v2 tile that fits, then every v3 tile (bf16
    only); v2 needs its channel multiples and, for float32 data, TF32 allowed."""
    x = numpy.zeros((2, 14, 14, 64), dtype=numpy.uint16)
    w = numpy.zeros((128, 3, 3, 64), dtype=numpy.uint16)
    geometry = (2, 14, 14, 64, 128, 3, 3, 14, 14, 1, 1)
    plans = emulated.plans("conv_fwd", (x, w), geometry)
    assert plans[0] == Plan("v1", "Bf16Tile", 1)
    assert [p.version for p in plans] == sorted(p.version for p in plans), "v1, then v2, then v3"
    assert {p.tile for p in plans if p.version == "v2"} == {"bf16_128x256", "bf16_256x128", "bf16_128x128"}
    assert {p.tile for p in plans if p.version == "v3"} == {"bf16_128x256", "bf16_128x128"}
    assert all(p.splits >= 1 for p in plans)
    narrow = numpy.zeros((2, 14, 14, 32), dtype=numpy.uint16), numpy.zeros((128, 3, 3, 32), dtype=numpy.uint16)
    assert emulated.plans("conv_fwd", narrow, (2, 14, 14, 32, 128, 3, 3, 14, 14, 1, 1)) == [Plan("v1", "Bf16Tile", 1)]
    floats = x.astype(numpy.float32), w.astype(numpy.float32)
    assert {p.tile for p in emulated.plans("conv_fwd", floats, geometry)} == {"Tf32Tile", "tf32_128x256"}
    assert [p.version for p in emulated.plans("conv_wgrad", floats, geometry)] == ["v1"]  # TF32 grad-weight: v1
    small = numpy.zeros((1, 7, 7, 64), dtype=numpy.uint16), numpy.zeros((64, 1, 1, 64), dtype=numpy.uint16)
    splits = {p.splits for p in emulated.plans("conv_fwd", small, (1, 7, 7, 64, 64, 1, 1, 7, 7, 1, 0))}
    assert splits == {1}, "one k-tile leaves nothing to split"


def scripted_timer(seconds, calls):
    """A timer that reports `seconds` in order (the plans themselves are checked above)."""
    answers = iter(seconds)

    def timer(function):
        calls.append(function)
        return next(answers)
    return timer


def every_plan_ok(known, record):
    """A validation (the canary's part) that finds every v2 kernel ok."""
    for plan in canary.PLANS:
        record(plan.name, {"status": "ok", "error": None, "max_error": 0.0, "seconds": 0.0})


@pytest.mark.slow
def test_the_autotuner_keeps_the_fastest_and_caches_it(emulated, tmp_path):
    shape = n, h, w, c, k, r, stride, padding = (1, 5, 7, 64, 72, 3, 1, 1)
    operands = (numpy.zeros((n, h, w, c), dtype=numpy.uint16), numpy.zeros((k, r, r, c), dtype=numpy.uint16))
    plans = emulated.plans("conv_fwd", operands, (n, h, w, c, k, r, r, h, w, stride, padding))
    fastest = len(plans) - 2  # any one but the v1 kernel
    cache, calls = tmp_path / "autotune" / "device-cuda13.json", []
    timer = scripted_timer([0.5 if i == fastest else 1.0 for i in range(len(plans))], calls)
    tuned = Kernels(emulated._load, emulated.multiprocessors, tuner=Autotuner(timer, cache, validate=every_plan_ok))
    ours, reference = run_pass(tuned, "bf16", "conv_fwd", shape)
    oracle.assert_close(ours, reference, oracle.TOLERANCE["bf16"], "the tuned forward pass")
    report = tuned.tuner.report()
    assert report["tuned"] == 1 and list(report["choices"].values()) == [plans[fastest].label()]
    candidates = next(iter(report["candidates"].values()))
    assert len(calls) == len(plans) and [c["plan"] for c in candidates] == [p.label() for p in plans]
    assert all(c["status"] == "ok" and c["max_error"] <= 3e-2 for c in candidates), candidates
    assert json.loads(cache.read_text())["choices"] == report["choices"]

    calls.clear()  # a new process: the cache answers, nothing is timed, the same plan runs
    again = Kernels(emulated._load, emulated.multiprocessors, tuner=Autotuner(timer, cache, validate=every_plan_ok))
    ours_again, _ = run_pass(again, "bf16", "conv_fwd", shape)
    assert calls == [] and again.tuner.report()["tuned"] == 0
    assert list(again.tuner.report()["choices"].values()) == [plans[fastest].label()]
    assert numpy.array_equal(ours_again, ours), "the same cache gives the same kernel, the same bits"


def test_a_choice_is_remembered_only_for_what_it_was_chosen_for(emulated):
    """The same float32 shape with TF32 allowed and then not: the tuner's choice for the TF32
    tiles must not serve the exact float32 kernels (the key names the v1 tile, hence TF32)."""
    shape = (1, 5, 7, 32, 36, 3, 1, 1)
    later_is_faster = itertools.count(100.0, -1.0)  # a v2 plan wins the TF32 key
    tuned = Kernels(emulated._load, emulated.multiprocessors,
                    tuner=Autotuner(lambda function: next(later_is_faster), None, validate=every_plan_ok))
    allowed = tuned.allow_tf32
    try:
        tuned.allow_tf32 = True
        run_pass(tuned, "tf32", "conv_fwd", shape)
        tuned.allow_tf32 = False
        ours, reference = run_pass(tuned, "tf32", "conv_fwd", shape)
    finally:
        tuned.allow_tf32 = allowed
    tf32_choice, exact_choice = tuned.tuner.choices.values()
    assert tf32_choice.version == "v2" and exact_choice == Plan("v1", "SimtTile", 1)
    oracle.assert_close(ours, reference, oracle.TOLERANCE["fp32"], "exact float32 after a TF32 choice")


def test_without_a_tuner_the_v1_kernel_runs(emulated):
    """MINIDL_AUTOTUNE=0 (no tuner): the first plan, v1, which has run on GPUs before."""
    launched = []
    original = emulated.launch

    def recording(family, name, *args, **kwargs):
        launched.append(name)
        return original(family, name, *args, **kwargs)

    plain = Kernels(emulated._load, emulated.multiprocessors)
    plain.launch = recording
    run_pass(plain, "bf16", "conv_fwd", (1, 5, 7, 64, 72, 3, 1, 1))
    assert launched and all("_v2" not in name for name in launched)


def test_no_timing_during_a_graph_capture(emulated):
    """A key first met while a CUDA graph is captured takes the v1 plan untimed (timing would
    synchronize the capturing stream)."""
    calls = []
    tuner = Autotuner(scripted_timer([], calls), capturing=lambda: True, validate=every_plan_ok)
    plans = [Plan("v1", "Bf16Tile"), Plan("v2", "bf16_128x128")]
    assert tuner.choose("conv_fwd key", lambda: plans, lambda plan: None) == plans[0] and calls == []


@pytest.mark.parametrize("mode", ["bf16", "tf32"])
@pytest.mark.slow
def test_a_misaligned_operand_is_copied_not_refused(emulated, mode):
    """A view 2 (bf16) or 4 (float32) bytes into its allocation cannot feed the tensor-core tiles'
    16-byte copies: it is copied to an aligned buffer, and the result is the aligned operand's,
    bit for bit (the same tile, the same data), with the v1 kernel and with a v2 one."""
    shape = n, h, w, c, k, r, stride, padding = (1, 5, 7, 64, 72, 3, 1, 1)
    data = oracle.Inputs(numpy, mode, 0)
    x, wt = data.normal((n, h, w, c)), data.normal((k, r, r, c), scale=(r * r * c) ** -0.5)
    storage = numpy.zeros(x.size + 1, dtype=x.dtype)
    misaligned = storage[1:].reshape(x.shape)
    misaligned[...] = x
    assert misaligned.ctypes.data % 16 != 0
    tile = "bf16_128x128" if mode == "bf16" else "tf32_128x256"
    for plan in (None, Plan("v2", tile)):
        ours = emulated.conv_forward(misaligned, wt, stride, padding, plan=plan)
        assert numpy.array_equal(ours, emulated.conv_forward(x, wt, stride, padding, plan=plan)), plan
    assert emulated.v1_plan("conv_fwd", (misaligned, wt), (n, h, w, c, k, r, r, h, w, stride, padding)).tile == \
        ("Bf16Tile" if mode == "bf16" else "Tf32Tile")
