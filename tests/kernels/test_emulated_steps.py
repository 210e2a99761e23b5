"""The GPU path above single kernels, run on the CPU emulator (step_checks.py; the GPU cases run
the same checks on ResNet-50 shapes): the fused ops' GPU branch, the fused residual blocks, the
blocks and networks with batch norm fused into their convolutions (the v1 composition, and the
v2 kernels against the float32 step), a training step under autocast against the float32 step,
and steps replayed through GraphedStep against the same steps run eagerly. The CUDA graph itself
exists only on a GPU: here a stand-in records the step function at capture (queuing no work, as
a capturing stream does) and runs it at each launch, so what is tested is GraphedStep's own
logic: warm-up, one capture, the static batch buffers, the rate through device scalars, the
eager path for another batch size."""
import contextlib

import numpy
import pytest

import oracle
import step_checks
from step_checks import seeded
from minidl.training.device_step import DeviceStep
from minidl import nn
from minidl.models.resnet import BasicBlock, Bottleneck, ResNet, cifar_stem, conv3x3
from minidl.optim import SGD

# mode, NHWC shape, residual, training, group_size
FUSED_CASES = {
    "relu, two channel blocks": ("fp32", (2, 5, 3, 40), False, True, None),
    "add+relu": ("fp32", (2, 4, 3, 16), True, True, None),
    "add+relu, eval": ("fp32", (2, 4, 3, 16), True, False, None),
    "relu, ghost groups of 2": ("fp32", (6, 3, 3, 16), False, True, 2),
    "add+relu, ghost groups of 2": ("fp32", (4, 3, 3, 8), True, True, 2),
    "bf16 relu": ("bf16", (2, 5, 3, 40), False, True, None),
    "bf16 add+relu, ghost groups of 3": ("bf16", (6, 3, 3, 16), True, True, 3),
}


@pytest.mark.parametrize("case", FUSED_CASES)
def test_fused_op_gpu_branch(emulated_gpu, case):
    mode, shape, residual, training, group_size = FUSED_CASES[case]
    step_checks.check_fused_op(numpy, mode, shape, residual, training, group_size)


@pytest.mark.parametrize("build, shape", [
    (lambda: BasicBlock(16, 16), (2, 5, 5, 16)),            # identity shortcut
    (lambda: Bottleneck(16, 8, stride=2), (2, 6, 5, 16)),  # projection shortcut, stride 2
])
def test_fused_block_matches_the_unfused_block_on_the_kernels(emulated_gpu, build, shape):
    step_checks.check_fused_block(numpy, seeded(build), shape, tolerance=1e-6)


# build(fuse), NHWC shape, training, group_size, modes: odd sizes, channel counts that take the
# tensor-core tiles (multiples of 8) and the fp32 path. TF32 where the tolerance allows it: the
# bottlenecks' batch norms over 18 to 60 values per channel amplify TF32's rounding to 3e-2 in
# their gradients, the separate ops' block on the kernels exactly as much (measured). The tiny
# ResNet adds the stem (conv2d_stats, then bn_add_relu without a residual).
NORMCONV_BLOCKS = {
    "basic, identity": (lambda fuse: BasicBlock(8, 8, fuse=fuse), (2, 5, 3, 8), True, None, ("fp32", "tf32")),
    "basic, projection, stride 2, ghost groups of 2": (lambda fuse: BasicBlock(6, 8, 2, fuse), (4, 5, 6, 6), True, 2,
                                                       ("fp32", "tf32")),
    "bottleneck, projection, stride 2": (lambda fuse: Bottleneck(16, 8, 2, fuse), (2, 6, 5, 16), True, None,
                                         ("fp32",)),
    "bottleneck, identity, eval": (lambda fuse: Bottleneck(12, 3, fuse=fuse), (2, 3, 5, 12), False, None, ("fp32",)),
    "tiny ResNet": (lambda fuse: ResNet(cifar_stem(), BasicBlock, (16, 16), (1, 1), 10, False, fuse), (2, 7, 6, 3),
                    True, None, ("fp32",)),
}


@pytest.mark.parametrize("case, mode", [(case, mode) for case, spec in NORMCONV_BLOCKS.items() for mode in spec[-1]])
def test_normconv_block_on_the_kernels_against_separate_ops(emulated_gpu, case, mode):
    build, shape, training, group_size, _ = NORMCONV_BLOCKS[case]
    step_checks.check_normconv_block(numpy, build, shape, training, group_size, mode)


# CIFAR stem (16 channels), then one projecting and one identity block; channel counts are
# multiples of 8, as the bf16 tiles need
TINY_RESNETS = {
    "basic": lambda: ResNet(cifar_stem(), BasicBlock, (16, 32), (1, 1), 10, False),
    "bottleneck": lambda: ResNet(cifar_stem(), Bottleneck, (16,), (2,), 10, False),
}


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16"])
@pytest.mark.slow
def test_fused_model_steps_as_the_separate_ops_on_the_kernels(emulated_gpu, amp):
    """Without a tuner each fused pass takes its v1 plan, the separate ops' kernels composed: in
    float32 the same step bit for bit; in bf16 a projection's normalized shortcut is added
    before rounding (the separate ops store it in bf16 first), within bf16's tolerance."""
    rng = numpy.random.default_rng(0)
    images, labels = rng.integers(0, 256, (2, 8, 8, 3), dtype=numpy.uint8), rng.integers(0, 10, 2)
    steps = [step_checks.one_step(seeded(lambda: ResNet(cifar_stem(), BasicBlock, (16, 32), (1, 1), 10, False, fuse)),
                                  images, labels, amp) for fuse in (True, False)]
    (loss, grads, stats), (ref_loss, ref_grads, ref_stats) = steps
    if not amp:
        assert loss == ref_loss and numpy.array_equal(stats, ref_stats)
        assert all(numpy.array_equal(g, r) for g, r in zip(grads, ref_grads))
        return
    oracle.assert_close(loss, ref_loss, oracle.TOLERANCE["bf16"], "loss")
    oracle.assert_close(stats, ref_stats, oracle.TOLERANCE["bf16"], "running statistics")
    for index, (g, r) in enumerate(zip(grads, ref_grads)):
        oracle.assert_close(g, r, oracle.TOLERANCE["bf16"], f"gradient {index}")


class PreferV2:
    """A stand-in for the autotuner that takes the last plan, a v2 kernel where one fits (the
    real tuner times them; here every fused v2 kernel is to run), and records the keys."""

    def __init__(self):
        self.chosen = []

    def choose(self, key, plans, run, kind="", tolerance=0.0, outputs=None):
        plans = plans()
        self.chosen.append((key, plans[-1].version))
        return plans[-1]


@pytest.mark.slow
def test_fused_model_on_the_v2_kernels_steps_as_the_separate_ops(emulated_gpu):
    """A bf16 (--amp) step whose fused passes run the v2 kernels (statistics in the epilogue,
    the normalizing load, grad-input's masked epilogue, grad-weight's normalizing load) against
    the float32 step of the separate ops, held to the bound a bf16 step of the separate ops is
    held to (AMP_TOLERANCE)."""
    rng = numpy.random.default_rng(0)
    images, labels = rng.integers(0, 256, (2, 8, 8, 3), dtype=numpy.uint8), rng.integers(0, 10, 2)

    def build(fuse):  # a 64-channel stem: every block's convolution has a v2 tile
        return seeded(lambda: ResNet((conv3x3(3, 64), nn.BatchNorm2d(64), None), BasicBlock, (64, 64), (1, 1), 10,
                                     False, fuse))

    ref_loss, ref_grads, ref_stats = step_checks.one_step(build(False), images, labels, False)
    previous, emulated_gpu.tuner = emulated_gpu.tuner, PreferV2()
    try:
        loss, grads, stats = step_checks.one_step(build(True), images, labels, True)
        chosen = emulated_gpu.tuner.chosen
    finally:
        emulated_gpu.tuner = previous
    fused_v2 = {key.split(" ")[0] for key, version in chosen if "+" in key and version == "v2"}
    assert fused_v2 == {"conv_fwd+stats", "conv_fwd+normalize+stats", "conv_dgrad+drelu", "conv_wgrad+normalize"}
    errors = {"loss": abs(loss - ref_loss) / abs(ref_loss),
              "gradient": step_checks.relative_error(step_checks.flat(grads), step_checks.flat(ref_grads)),
              "worst parameter": max(step_checks.relative_error(g, r) for g, r in zip(grads, ref_grads)),
              "statistics": step_checks.relative_error(stats, ref_stats)}
    for name, bound in step_checks.AMP_TOLERANCE["tiny"].items():
        assert errors[name] <= bound, f"the fused bf16 step: {name} differs by {errors[name]:.3g}; all: {errors}"


@pytest.mark.parametrize("name", TINY_RESNETS)
@pytest.mark.slow
def test_amp_step_against_the_float32_step(emulated_gpu, name):
    step_checks.check_amp_step(numpy, seeded(TINY_RESNETS[name]), (4, 8, 8, 3), 10, step_checks.AMP_TOLERANCE["tiny"])


class StandInCapture:
    """CudaCapture's interface without CUDA (see the module's docstring)."""

    def __init__(self):
        self.captures = self.launches = 0

    @contextlib.contextmanager
    def running(self):
        yield

    def capture(self, function):
        self.captures += 1
        return function

    def launch(self, graph):
        self.launches += 1
        graph()


@pytest.mark.slow
def test_replayed_steps_equal_eager_steps(emulated_gpu):
    cuda = StandInCapture()
    step_checks.check_graph_replay(numpy, seeded(TINY_RESNETS["basic"]), (2, 8, 8, 3), amp=True, graph_cuda=cuda,
                                   steps=5)
    # one warm-up, one captured and launched, one replay, the short batch eagerly, one replay
    assert (cuda.captures, cuda.launches) == (1, 3)


@pytest.mark.slow
def test_each_step_refreshes_the_bf16_weights_after_the_update(emulated_gpu):
    """Under --amp the convolutions read the flat buffer's bf16 copy: it must hold the weights the
    previous update left, i.e. be refreshed inside each step, before its forward pass."""
    model = seeded(TINY_RESNETS["basic"])()
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = DeviceStep(model, optimizer, amp=True)
    rng = numpy.random.default_rng(0)
    images, labels = rng.integers(0, 256, (2, 8, 8, 3), dtype=numpy.uint8), rng.integers(0, 10, 2)
    step(images, labels)
    updated = optimizer.flat.data.copy()
    step(images, labels)
    assert numpy.array_equal(optimizer.flat.bf16, oracle.to_bf16(updated))
