"""The ResNet family: parameter counts, torchvision names, equivalence with a plain-torch
reference written here (NCHW, float64), initialization statistics, eval mode.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import assert_close, copy_to_torch, kcrs_to_krsc, nhwc_to_nchw, rng
from minidl import Tensor, models, nn, ops
from minidl.bench.torch_resnet import torch_cifar_resnet, torch_resnet50


def torch_count(module):
    return sum(p.numel() for p in module.parameters())


# --- parameter counts and names --------------------------------------------------------------

@pytest.mark.parametrize("name,count", [
    ("resnet18", 11_689_512), ("resnet34", 21_797_672), ("resnet50", 25_557_032),
    ("resnet101", 44_549_160),
])
def test_imagenet_parameter_counts_match_torchvision(name, count):
    assert getattr(models, name)(num_classes=1000).num_parameters() == count


@pytest.mark.parametrize("depth", [20, 32, 56])
def test_cifar_parameter_counts_match_torch_reference(depth):
    ours = getattr(models, f"resnet{depth}")(num_classes=10)
    assert ours.num_parameters() == torch_count(torch_cifar_resnet(depth, 10))
    names = [name for name, _ in ours.named_parameters()]
    assert names == [name for name, _ in torch_cifar_resnet(depth, 10).named_parameters()]


def test_resnet50_names_and_order_match_torch():
    ours, theirs = models.resnet50(num_classes=10), torch_resnet50(10)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    torch_buffers = [n for n, _ in theirs.named_buffers() if not n.endswith("num_batches_tracked")]
    assert [n for n, _ in ours.named_buffers()] == torch_buffers
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert tuple(kcrs_to_krsc(np.empty(tuple(q.shape))).shape) == p.shape, name


# --- equivalence with the torch reference ----------------------------------------------------

def run_both(ours, theirs, x, labels, smoothing):
    """Forward + softmax cross-entropy + backward on both models; returns the logits."""
    logits = ours(Tensor(x))
    loss = ops.softmax_cross_entropy(logits, labels, label_smoothing=smoothing)
    loss.backward()
    ref_logits = theirs(nhwc_to_nchw(x))
    ref_loss = F.cross_entropy(ref_logits, torch.from_numpy(labels), label_smoothing=smoothing)
    ref_loss.backward()
    assert_close(loss.data, ref_loss.detach().numpy(), name="loss")
    assert_close(logits.data, ref_logits.detach().numpy(), name="logits")


def compare_gradients_and_buffers(ours, theirs):
    ref_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        assert p.grad is not None, name
        assert_close(p.grad.data, kcrs_to_krsc(ref_params[name].grad.numpy()), rtol=1e-6, atol_scale=1e-8,
                     name=f"grad {name}")
    ref_buffers = dict(theirs.named_buffers())
    for name, array in ours.named_buffers():
        assert_close(array, ref_buffers[name].numpy(), name=f"buffer {name}")


def randomize_norm_state(model, seed):
    """Non-trivial γ, β and running statistics, so BN is not the identity."""
    r, state = rng(seed), {}
    for name, array in model.state_dict().items():
        if name.endswith(("running_mean", "bn1.bias", "bn2.bias", "bn3.bias", "1.bias")):
            state[name] = 0.1 * r.standard_normal(array.shape)
        elif name.endswith("running_var") or (array.ndim == 1 and name.endswith("weight")):
            state[name] = 0.5 + r.random(array.shape)
        else:
            state[name] = np.array(array)
    model.load_state_dict(state)


@pytest.mark.parametrize("builder,reference,x_shape,classes", [
    ("resnet50", lambda c: torch_resnet50(c), (2, 64, 64, 3), 10),
    ("resnet20", lambda c: torch_cifar_resnet(20, c), (4, 16, 16, 3), 10),
    ("resnet8_w8", lambda c: torch_cifar_resnet(8, c, width=8), (4, 16, 16, 3), 10),
], ids=["resnet50", "resnet20", "resnet8_w8"])
def test_training_step_matches_torch(builder, reference, x_shape, classes):
    nn.manual_seed(1)
    ours = getattr(models, builder)(num_classes=classes).astype(np.float64)
    randomize_norm_state(ours, seed=2)
    theirs = reference(classes).double().train()
    copy_to_torch(ours, theirs)
    x = rng(3).standard_normal(x_shape)
    labels = rng(4).integers(0, classes, size=x_shape[0])
    run_both(ours.train(), theirs, x, labels, smoothing=0.1)
    compare_gradients_and_buffers(ours, theirs)


def test_eval_mode_uses_running_stats_like_torch():
    nn.manual_seed(5)
    ours = models.resnet20(num_classes=7).astype(np.float64)
    randomize_norm_state(ours, seed=6)
    theirs = torch_cifar_resnet(20, 7).double()
    copy_to_torch(ours, theirs)
    ours.eval(), theirs.eval()
    assert not any(m.training for _, m in ours.named_modules())
    before = {k: np.array(v) for k, v in ours.named_buffers()}
    x = rng(7).standard_normal((3, 8, 8, 3))
    labels = np.array([0, 3, 6])
    run_both(ours, theirs, x, labels, smoothing=0.0)
    compare_gradients_and_buffers(ours, theirs)
    for name, array in ours.named_buffers():
        np.testing.assert_array_equal(array, before[name], err_msg=f"{name} changed in eval mode")
    # and the running statistics really are used: batch statistics give other logits
    with_batch_stats = ours.train()(Tensor(x)).data
    assert not np.allclose(with_batch_stats, theirs.eval()(nhwc_to_nchw(x)).detach().numpy(), rtol=1e-3)


# --- initialization ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def resnet50_default():
    nn.manual_seed(0)
    return models.resnet50(num_classes=1000)


def test_conv_init_is_he_normal_fan_out(resnet50_default):
    convs = [(name, p.data) for name, p in resnet50_default.named_parameters() if p.data.ndim == 4]
    assert len(convs) == 53
    for name, w in convs:
        k, r, s, c = w.shape
        expected = math.sqrt(2.0 / (k * r * s))  # fan_out; fan_in = c·r·s would differ for most layers
        tolerance = 6 / math.sqrt(2 * w.size)   # ~6 standard errors of a sample std
        assert abs(w.std() / expected - 1) < tolerance + 0.01, f"{name}: std {w.std():.4g} vs {expected:.4g}"
        assert abs(w.mean()) < 6 * expected / math.sqrt(w.size), name
    # the stem separates fan_out (64·7·7) from fan_in (3·7·7) by a factor of ~4.6 in std
    stem = resnet50_default.conv1.weight.data
    assert abs(stem.std() - math.sqrt(2 / (64 * 49))) < 0.1 * math.sqrt(2 / (64 * 49))


def test_fc_init(resnet50_default):
    w, b = resnet50_default.fc.weight.data, resnet50_default.fc.bias.data
    assert w.shape == (1000, 2048)
    assert abs(w.std() - 0.01) < 0.0002 and abs(w.mean()) < 0.0001
    assert abs(np.mean(np.abs(w)) - 0.01 * math.sqrt(2 / math.pi)) < 0.0002  # normal, not uniform
    np.testing.assert_array_equal(b, 0)


def test_bn_init_without_zero_init_residual(resnet50_default):
    for name, p in resnet50_default.named_parameters():
        if p.data.ndim == 1 and name != "fc.bias":
            expected = 1.0 if name.endswith("weight") else 0.0
            np.testing.assert_array_equal(p.data, expected, err_msg=name)


def last_bn_names(model, last):
    return {f"{stage}.{i}.{last}.weight" for stage in ("layer1", "layer2", "layer3", "layer4")
            if hasattr(model, stage) for i in range(len(list(getattr(model, stage))))}


@pytest.mark.parametrize("builder,last,blocks", [("resnet50", "bn3", 16), ("resnet18", "bn2", 8),
                                                  ("resnet20", "bn2", 9)])
def test_zero_init_residual(builder, last, blocks):
    model = getattr(models, builder)(num_classes=10, zero_init_residual=True)
    zeroed = last_bn_names(model, last)
    assert len(zeroed) == blocks
    gammas = {name: p.data for name, p in model.named_parameters() if name.endswith("weight") and p.data.ndim == 1}
    assert zeroed <= set(gammas)
    for name, gamma in gammas.items():
        np.testing.assert_array_equal(gamma, 0.0 if name in zeroed else 1.0, err_msg=name)


def test_zero_init_residual_blocks_start_as_identity():
    nn.manual_seed(8)
    model = models.resnet20(num_classes=10, zero_init_residual=True).astype(np.float64)
    x = Tensor(np.abs(rng(9).standard_normal((2, 6, 6, 16))))  # non-negative: relu(x) == x
    block = model.layer1[1]
    np.testing.assert_array_equal(block(x).data, x.data)


def test_same_seed_same_model_different_seed_different_model():
    def build(seed):
        nn.manual_seed(seed)
        return models.resnet20()
    a, b, c = build(3), build(3), build(4)
    for (name, p), (_, q), (_, r) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)
        if p.data.ndim == 4:
            assert not np.array_equal(p.data, r.data), name


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_every_model_has_a_torch_twin_of_the_same_size(name):
    from minidl.bench.torch_resnet import torch_resnet
    assert models.MODELS[name](num_classes=7).num_parameters() == torch_count(torch_resnet(name, 7))
