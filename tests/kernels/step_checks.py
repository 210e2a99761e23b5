"""Checks of the GPU path above single kernels, shared by the CPU-emulation tests (tiny shapes,
NumPy arrays on the emulated kernels) and the GPU cases (ResNet-50 shapes, CuPy):

check_fused_op      minidl.ops.norm_relu's GPU branch (plain, with a residual, ghost groups; fp32 and
                    bf16) against the float64 reference of the unfused ops: forward, running
                    statistics, every gradient (oracle.TOLERANCE)
check_fused_block   a residual block (its fused ops) against the same block written with the
                    unfused ops, on the same device: output, every gradient, the statistics
check_normconv_block  a block (or a network) with batch norm fused into its convolutions
                    (minidl.ops.normconv) on the kernels against the same of separate ops in
                    float64 (oracle.TOLERANCE)
check_amp_step      a training step under autocast (bf16) against the float32 step: AMP_TOLERANCE
check_graph_replay  DeviceStep steps replayed from a CUDA graph (GraphedStep) against the same
                    steps run eagerly, the rate changing every step and one batch of another size
                    in between: bit for bit on the emulator; on a GPU within 1e-5, in case a
                    CuPy reduction (the classifier bias's sum) takes another route on the
                    capture stream
check_training_with_graphs   train.py's loop (minidl.trainer.run) with --amp --cuda-graph against
                    --amp alone: the same metrics (GPU only)

`xp` is the array module of the data (NumPy for the emulation, CuPy on a GPU); models come from
`build()`, which seeds them, so every run of a comparison starts from the same state.
"""
import sys
from pathlib import Path

import numpy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for helpers.py

import oracle  # noqa: E402
from helpers import unfused_block_forward  # noqa: E402
from minidl import Tensor, kernels, nn, ops  # noqa: E402
from minidl.backend import get_array_module, to_numpy  # noqa: E402
from minidl.training.device_step import DeviceStep  # noqa: E402
from minidl.training.graph import GraphedStep  # noqa: E402
from minidl.optim import SGD  # noqa: E402

# A bf16 step against the float32 step, as relative errors |Δ| / |float32|: the loss; the
# gradient of the whole model and of its worst parameter (L2 norms); the BN statistics. bf16
# rounds every activation and every gradient between layers to 8 significant bits (2^-9), and
# the rounding moves some values across a ReLU's zero: each such element changes its gradient
# entirely. Measured on the emulator's tiny ResNets (basic, bottleneck): loss 1e-5, gradient
# 1.1e-2, worst parameter 0.20 (a BN β in the first block), statistics 2.4e-4; a branch's
# gradient dropped at a fork gives 0.06 and 0.5 to 1.0.
#
# A deep network amplifies such rounding by itself, bf16 or not: ResNet-50 with batch norm at
# initialization is chaotic (on the GPU, batch 16: the bf16 gradient differed from the float32
# one by 120%; in float32 on the CPU, 2^-9 relative noise on the weights alone changes the
# gradient by 120 to 130%). Its check therefore (1) scales the last γ of every residual branch
# by LAST_GAMMA_SCALE (near Goyal et al.'s zero-γ init, under which the net is well conditioned,
# yet every branch keeps a gradient), and (2) measures the float32 step's own sensitivity: the
# gradient's change under 2^-9 relative noise on the weights. The bf16 gradient must stay within
# "× sensitivity" times that. Measured on the emulator, ResNet-50 at 4×64×64: gradient 0.13,
# sensitivity 0.12, so 1.1 times; a wrong kernel or a dropped branch gives 1 or more against
# a sensitivity of about 0.1, so 10 times or more.
LAST_GAMMA_SCALE = 0.1
AMP_TOLERANCE = {"tiny": {"loss": 1e-3, "gradient": 0.04, "worst parameter": 0.35, "statistics": 5e-3},
                 "resnet50": {"loss": 1e-2, "× sensitivity": 3.0, "statistics": 2e-2}}


def relative_error(actual, expected):
    actual, expected = to_numpy(actual).astype(numpy.float64), to_numpy(expected).astype(numpy.float64)
    assert numpy.isfinite(actual).all(), "non-finite values"
    return float(numpy.linalg.norm(actual - expected) / max(numpy.linalg.norm(expected), 1e-30))


def randomize_norms(model, seed):
    """γ in [0.5, 1.5] and β in [-0.5, 0.5] (in place: they may be flat-buffer views)."""
    rng = numpy.random.default_rng(seed)
    for _, module in model.named_modules():
        if isinstance(module, nn.BatchNorm2d):
            for parameter, low, high in ((module.weight, 0.5, 1.5), (module.bias, -0.5, 0.5)):
                host = rng.uniform(low, high, parameter.shape).astype(parameter.dtype)
                parameter.data[...] = get_array_module(parameter.data).asarray(host)
    return model


def buffers_of(model):
    return numpy.concatenate([to_numpy(b).reshape(-1) for _, b in model.named_buffers()])


# ---- fused ops ----------------------------------------------------------------------------------

def check_fused_op(xp, mode, shape, residual, training=True, group_size=None, seed=0):
    """ops.batch_norm_relu / batch_norm_add_relu on xp data (float32, or bf16 bits) against the
    unfused ops in float64; the backward's ReLU mask is the op's own output (as in oracle)."""
    data = oracle.Inputs(xp, mode, seed)
    channels = shape[-1]
    x, gy = data.normal(shape), data.normal(shape)
    extra = [data.normal(shape)] if residual else []
    gamma = data.rng.uniform(0.5, 1.5, channels).astype(numpy.float32)
    beta = data.rng.uniform(-0.5, 0.5, channels).astype(numpy.float32)
    running = [data.rng.uniform(-0.2, 0.2, channels).astype(numpy.float32),
               data.rng.uniform(0.5, 2.0, channels).astype(numpy.float32)]
    tol = oracle.TOLERANCE["bf16" if mode == "bf16" else "fp32"]

    inputs = [Tensor(data.kernel(a), requires_grad=True) for a in [x] + extra]
    params = [Tensor(xp.asarray(a), requires_grad=True) for a in (gamma, beta)]
    kernel_running = [xp.array(a) for a in running]
    state = (*kernel_running, training, 0.1, 1e-5, group_size)
    op = ops.batch_norm_add_relu if residual else ops.batch_norm_relu
    y = op(inputs[0], *inputs[1:], *params, *state)
    y.backward(data.kernel(gy))

    def reference(running_state):
        x64 = Tensor(data.reference(x), requires_grad=True)
        gamma64, beta64 = (Tensor(xp.asarray(a.astype(numpy.float64)), requires_grad=True) for a in (gamma, beta))
        out = ops.batch_norm(x64, gamma64, beta64, *running_state, training, 0.1, 1e-5, group_size)
        return out, (x64, gamma64, beta64)

    ref_running = [xp.asarray(a.astype(numpy.float64)) for a in running]
    bn, _ = reference(ref_running)
    expected = ops.relu(bn + Tensor(data.reference(extra[0])) if residual else bn)
    oracle.assert_close(data.result(y.data), expected.data, tol, f"fused forward {mode}")
    for name, ours, theirs in zip(("running mean", "running var"), kernel_running, ref_running):
        oracle.assert_close(ours, theirs, oracle.TOLERANCE["fp32"], f"fused {name}")

    masked = data.reference(gy) * xp.asarray(data.result(y.data) > 0)
    bn, leaves = reference([xp.asarray(a.astype(numpy.float64)) for a in running])
    bn.backward(masked)
    for name, ours, theirs in zip(("x", "gamma", "beta"), inputs[:1] + params, leaves):
        oracle.assert_close(data.result(ours.grad.data), theirs.grad.data, tol, f"fused grad {name} {mode}")
    if residual:
        oracle.assert_close(data.result(inputs[1].grad.data), masked, tol, f"fused grad residual {mode}")


# ---- fused residual blocks ------------------------------------------------------------------------

def check_fused_block(xp, build, x_shape, tolerance, seed=0):
    """`build()` -> a block; its forward (fused ops) and the unfused one on two copies of it."""
    rng = numpy.random.default_rng(seed)
    x_host = rng.standard_normal(x_shape).astype(numpy.float32)
    runs = []
    for forward in (lambda block, x: block(x), unfused_block_forward):
        block = randomize_norms(build(), seed=1)
        x = Tensor(xp.asarray(x_host), requires_grad=True)
        y = forward(block, x)
        y.backward(xp.asarray(numpy.random.default_rng(seed + 1).standard_normal(y.shape).astype(y.dtype)))
        grads = [to_numpy(p.grad.data) for p in block.parameters()]
        runs.append((to_numpy(y.data), to_numpy(x.grad.data), grads, buffers_of(block)))
    (y, gx, grads, buffers), (ref_y, ref_gx, ref_grads, ref_buffers) = runs
    oracle.assert_close(y, ref_y, tolerance, "block output")
    oracle.assert_close(gx, ref_gx, tolerance, "block input gradient")
    for index, (ours, theirs) in enumerate(zip(grads, ref_grads)):
        oracle.assert_close(ours, theirs, tolerance, f"block parameter {index} gradient")
    oracle.assert_close(buffers, ref_buffers, tolerance, "block BN statistics")


def check_normconv_block(xp, build, x_shape, training, group_size, mode, seed=0):
    """`build(fuse)` -> a block or a network: with fuse=True on float32 xp data (the kernels; mode "fp32" or
    "tf32" convolutions), against fuse=False in float64 (the reference ops), within
    oracle.TOLERANCE[mode]: output, input gradient, every parameter gradient, the statistics."""
    active = kernels.active()
    previous, active.allow_tf32 = active.allow_tf32, mode == "tf32"
    try:
        _check_normconv_block(xp, build, x_shape, training, group_size, oracle.TOLERANCE[mode], seed)
    finally:
        active.allow_tf32 = previous


def _check_normconv_block(xp, build, x_shape, training, group_size, tolerance, seed):
    rng = numpy.random.default_rng(seed)
    x_host = rng.standard_normal(x_shape).astype(numpy.float32)
    runs = []
    for fuse, dtype in ((True, numpy.float32), (False, numpy.float64)):
        nn.manual_seed(0)
        block = randomize_norms(build(fuse).astype(dtype), seed=1).train(training)
        for _, module in block.named_modules():
            if isinstance(module, nn.BatchNorm2d):
                module.group_size = group_size
        x = Tensor(xp.asarray(x_host.astype(dtype)), requires_grad=True)
        y = block(x)
        y.backward(xp.asarray(numpy.random.default_rng(seed + 1).standard_normal(y.shape).astype(dtype)))
        runs.append([y.data, x.grad.data] + [p.grad.data for p in block.parameters()] + [buffers_of(block)])
    names = ["block output", "block input gradient"] + [f"parameter {i} gradient" for i in range(len(runs[0]) - 3)]
    for name, ours, theirs in zip(names + ["BN statistics"], *runs):
        oracle.assert_close(ours, theirs, tolerance, f"normconv {name}")


# ---- a training step under autocast -------------------------------------------------------------

def one_step(build, images, labels, amp, weight_noise=0.0):
    """(loss, [gradient of each parameter], BN statistics) of one DeviceStep from a fresh model
    (its weights times 1 + `weight_noise`·N(0, 1) where that is not 0)."""
    model = build()
    if weight_noise:
        rng = numpy.random.default_rng(2)
        for p in model.parameters():
            noise = 1 + weight_noise * rng.standard_normal(p.shape)
            p.data[...] *= get_array_module(p.data).asarray(noise.astype(numpy.float32))
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, norm_weight_decay=0.0)
    step = DeviceStep(model, optimizer, label_smoothing=0.1, amp=amp)
    step(images, labels)
    loss_sum, nonfinite = step.take_totals()
    assert nonfinite == 0, "a non-finite loss"
    return loss_sum / len(labels), [to_numpy(p.grad.data).copy() for p in model.parameters()], buffers_of(model)


def seeded(build):
    """`build` from the same seed at every call: each side of a comparison starts alike."""
    def seeded_build():
        nn.manual_seed(0)
        return build()
    return seeded_build


def randomized(build, last_gamma_scale=1.0):
    """`build` followed by randomize_norms, and the γ ending each residual branch times `last_gamma_scale`."""
    def build_and_randomize():
        model = randomize_norms(build(), seed=1)
        for _, module in model.named_modules():
            if hasattr(module, "last_bn"):
                module.last_bn.weight.data[...] *= last_gamma_scale
        return model
    return build_and_randomize


def flat(grads):
    return numpy.concatenate([g.ravel() for g in grads])


def check_amp_step(xp, build, images_shape, classes, tolerance, seed=0):
    """The bf16 step against the float32 step, both on this device's kernels, on random uint8
    images, within `tolerance` (an AMP_TOLERANCE entry); returns the errors. With a tolerance
    "× sensitivity", the model's last γ are scaled down and the gradient is held to that many
    times the float32 step's change under 2^-9 weight noise (see AMP_TOLERANCE)."""
    rng = numpy.random.default_rng(seed)
    images = xp.asarray(rng.integers(0, 256, images_shape, dtype=numpy.uint8))
    labels = xp.asarray(rng.integers(0, classes, images_shape[0]))
    relative = "× sensitivity" in tolerance
    build = randomized(build, LAST_GAMMA_SCALE if relative else 1.0)
    (loss, grads, stats), (ref_loss, ref_grads, ref_stats) = (one_step(build, images, labels, amp)
                                                              for amp in (True, False))
    errors = {"loss": abs(loss - ref_loss) / abs(ref_loss),
              "gradient": relative_error(flat(grads), flat(ref_grads)),
              "worst parameter": max(relative_error(g, r) for g, r in zip(grads, ref_grads)),
              "statistics": relative_error(stats, ref_stats)}
    if relative:
        noisy = one_step(build, images, labels, amp=False, weight_noise=2.0 ** -9)[1]
        errors["sensitivity"] = relative_error(flat(noisy), flat(ref_grads))
        errors["× sensitivity"] = errors["gradient"] / errors["sensitivity"]
        assert errors["sensitivity"] <= 0.5, (f"the float32 gradient changes by {errors['sensitivity']:.3g} under "
                                              f"2^-9 weight noise: too chaotic a model to compare bf16 with")
    for name, bound in tolerance.items():
        assert errors[name] <= bound, (f"bf16 step: the {name} differs by {errors[name]:.3g} (tolerance "
                                       f"{bound:.3g}); all errors: {errors}")
    return errors


# ---- a step replayed from a CUDA graph ------------------------------------------------------------

def run_steps(build, batches, rates, amp, graph_cuda=None, sgd_form="caffe2"):
    """Steps over `batches` [(images, labels)] at `rates`, eagerly (graph_cuda None) or through
    a GraphedStep (graph_cuda: "real" for CUDA, else a stand-in): (loss totals, parameters,
    momentum, BN statistics) afterwards."""
    model = randomize_norms(build(), seed=1)
    optimizer = SGD(model.parameters(), lr=rates[0], momentum=0.9, weight_decay=1e-4, form=sgd_form)
    step = DeviceStep(model, optimizer, label_smoothing=0.1, amp=amp)
    if graph_cuda is not None:
        step = GraphedStep(step, optimizer, batches[0][0].shape, warmup=1,
                           cuda=None if graph_cuda == "real" else graph_cuda)
    for (images, labels), rate in zip(batches, rates):
        optimizer.lr = rate
        step(images, labels)
    device_step = step.step if graph_cuda is not None else step
    totals = device_step.take_totals()
    return totals, to_numpy(optimizer.flat.data), to_numpy(optimizer.velocity), buffers_of(model)


def check_graph_replay(xp, build, image_shape, amp, graph_cuda="real", steps=6, seed=0, tolerance=0.0):
    """`steps` steps replayed against the same steps run eagerly: the rate changes every step
    (Caffe2's form, so the momentum correction changes too), and one batch is one image short
    (run eagerly by the graphed step). Equal within `tolerance` (0: bit for bit)."""
    rng = numpy.random.default_rng(seed)
    batches = []
    for k in range(steps):
        n = image_shape[0] - (k == steps - 2)
        batches.append((xp.asarray(rng.integers(0, 256, (n, *image_shape[1:]), dtype=numpy.uint8)),
                        xp.asarray(rng.integers(0, 10, n))))
    rates = [0.1 * (k + 1) for k in range(steps)]
    eager = run_steps(build, batches, rates, amp)
    replayed = run_steps(build, batches, rates, amp, graph_cuda)
    assert replayed[0][1] == eager[0][1] == 0, "non-finite losses"
    for name, ours, theirs in zip(("loss sum", "parameters", "momentum", "BN statistics"),
                                  (replayed[0][0], *replayed[1:4]), (eager[0][0], *eager[1:4])):
        oracle.assert_close(ours, theirs, tolerance, f"{name} after {steps} steps, replayed against eager")


def check_training_with_graphs(workdir):
    """One epoch of resnet20 on the embedded dataset, --amp --cuda-graph against --amp: the same
    metrics (the loss checked at every third step); returns both summaries."""
    from minidl.config import Config
    from minidl.trainer import run
    summaries = []
    for graph in (False, True):
        config = Config(epochs=1, amp=True, cuda_graph=graph, print_freq=3, dist_backend="mpi",
                        output_dir=str(Path(workdir) / f"cuda_graph_{graph}"), cache_dir=str(Path(workdir) / "cache"))
        summaries.append(run(config))
    eager, graphed = summaries
    for key in ("train_loss", "val_loss", "val_top1", "val_top5"):
        oracle.assert_close(graphed[key], eager[key], 1e-5, f"{key} with --cuda-graph against without")
    return summaries

