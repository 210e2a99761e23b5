"""The flat-buffer SGD: shared views, padding, and updates against torch.optim.SGD (float64).
"""
import numpy as np
import pytest
import torch

from helpers import copy_to_torch, kcrs_to_krsc, krsc_to_kcrs, nhwc_to_nchw, rng
from minidl import Tensor, nn, ops
from minidl.optim import SGD


class SmallNet(nn.Module):
    """conv(bias) -> BN -> relu -> conv(no bias) -> BN -> relu -> gap -> linear: every parameter kind."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 5, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(5)
        self.fc = nn.Linear(5, 3)

    def forward(self, x):
        x = ops.relu(self.bn1(self.conv1(x)))
        x = ops.relu(self.bn2(self.conv2(x)))
        return self.fc(ops.global_avg_pool(x))


class TorchSmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 5, 3, stride=2, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(5)
        self.fc = torch.nn.Linear(5, 3)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))


def small_net(seed=0):
    nn.manual_seed(seed)
    model = SmallNet().astype(np.float64)  # before any optimizer, so no views are broken
    for name, p in model.named_parameters():
        if p.kind == "norm":  # non-trivial γ, β
            p.data[...] = rng(seed + 1).uniform(0.5, 1.5, p.shape) if name.endswith("weight") else 0.1
    return model


EXPECTED_KINDS = {"conv1.weight": "weight", "conv1.bias": "bias", "bn1.weight": "norm", "bn1.bias": "norm",
                  "conv2.weight": "weight", "bn2.weight": "norm", "bn2.bias": "norm",
                  "fc.weight": "weight", "fc.bias": "bias"}


def test_small_net_registration_order_and_kinds():
    model = small_net()
    assert [(n, p.kind) for n, p in model.named_parameters()] == list(EXPECTED_KINDS.items())


# --- flat buffers ----------------------------------------------------------------------------

@pytest.mark.parametrize("align", [1, 7, 64, 1024])
def test_flat_buffers_are_views_in_registration_order(align):
    model = small_net()
    named = list(model.named_parameters())
    before = {n: p.data.copy() for n, p in named}
    opt = SGD(model.parameters(), lr=0.1, align=align)
    total = sum(p.size for _, p in named)
    assert total == 3 * 4 * 9 + 4 + 8 + 4 * 5 * 9 + 10 + 5 * 3 + 3
    assert len(opt.flat.data) == len(opt.flat.grad) == -(-total // align) * align
    assert len(opt.flat.data) % align == 0
    assert opt.flat.data.ndim == 1 and opt.flat.data.flags.c_contiguous

    offsets = np.cumsum([0] + [p.size for _, p in named])
    for (name, p), start, end in zip(named, offsets[:-1], offsets[1:]):
        np.testing.assert_array_equal(p.data, before[name], err_msg=f"{name}: value kept")
        np.testing.assert_array_equal(opt.flat.data[start:end], before[name].reshape(-1), err_msg=name)
        assert np.shares_memory(p.data, opt.flat.data) and np.shares_memory(p.grad.data, opt.flat.grad), name
    np.testing.assert_array_equal(opt.flat.data[total:], 0)

    # writes through the flat buffer reach every parameter, and back
    opt.flat.data[:] = np.arange(len(opt.flat.data))
    opt.flat.grad[:] = -np.arange(len(opt.flat.grad))
    for (name, p), start, end in zip(named, offsets[:-1], offsets[1:]):
        np.testing.assert_array_equal(p.data.reshape(-1), np.arange(start, end), err_msg=name)
        np.testing.assert_array_equal(p.grad.data.reshape(-1), -np.arange(start, end), err_msg=name)
    for index, (name, p) in enumerate(named):
        p.data[...] = 1000 + index
        p.grad.data[...] = -1000 - index
    for index, (start, end) in enumerate(zip(offsets[:-1], offsets[1:])):
        assert np.all(opt.flat.data[start:end] == 1000 + index) and np.all(opt.flat.grad[start:end] == -1000 - index)


def test_backward_writes_into_the_flat_grad_buffer():
    x, labels = rng(50).standard_normal((2, 6, 6, 3)), np.array([0, 2])
    reference, model = small_net(), small_net()
    ops.softmax_cross_entropy(reference(Tensor(x)), labels).backward()
    opt = SGD(model.parameters(), lr=0.1, align=32)
    for step in range(2):  # the second backward accumulates on top of the first
        ops.softmax_cross_entropy(model(Tensor(x)), labels).backward()
    start = 0
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        np.testing.assert_allclose(opt.flat.grad[start:start + p.size], 2 * q.grad.data.reshape(-1),
                                   rtol=1e-12, atol=1e-15, err_msg=name)
        start += p.size
    np.testing.assert_array_equal(opt.flat.grad[start:], 0)


def test_zero_grad_zeroes_the_flat_grad_and_keeps_the_views():
    model = small_net()
    opt = SGD(model.parameters(), lr=0.1, align=16)
    views = [p.grad.data for p in model.parameters()]
    ops.softmax_cross_entropy(model(Tensor(rng(51).standard_normal((2, 4, 4, 3)))), np.array([1, 1])).backward()
    assert np.abs(opt.flat.grad).sum() > 0
    opt.zero_grad()
    np.testing.assert_array_equal(opt.flat.grad, 0)
    assert all(p.grad.data is view for p, view in zip(model.parameters(), views))


def test_module_zero_grad_keeps_gradients_flowing_into_the_flat_buffer():
    """torch users call model.zero_grad(); after SGD(...) it must not detach .grad from the
    flat buffer (else backward writes elsewhere and step() silently applies no gradient)."""
    model = small_net()
    opt = SGD(model.parameters(), lr=0.1, momentum=0.0, align=16)
    before = opt.flat.data.copy()
    model.zero_grad()
    ops.softmax_cross_entropy(model(Tensor(rng(52).standard_normal((2, 4, 4, 3)))), np.array([0, 1])).backward()
    assert all(np.shares_memory(p.grad.data, opt.flat.grad) for p in model.parameters())
    opt.step()
    assert not np.array_equal(opt.flat.data, before)


def test_load_state_dict_keeps_the_views():
    model, other = small_net(seed=0), small_net(seed=7)
    opt = SGD(model.parameters(), lr=0.1, align=8)
    model.load_state_dict({k: np.array(v) for k, v in other.state_dict().items()})
    for (name, p), (_, q) in zip(model.named_parameters(), other.named_parameters()):
        assert np.shares_memory(p.data, opt.flat.data), name
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)


def test_rejects_duplicates_and_empty():
    model = small_net()
    with pytest.raises(ValueError):
        SGD(model.parameters() + [model.fc.weight], lr=0.1)
    with pytest.raises(ValueError):
        SGD([], lr=0.1)
    with pytest.raises(ValueError):
        SGD(small_net().parameters(), lr=0.1, momentum=0.0, nesterov=True)


# --- SGD steps against torch.optim.SGD ---------------------------------------------------------

def torch_twin(model):
    """torch tensors with the same values (KCRS for convs), keyed by minidl parameter name."""
    return {name: torch.tensor(krsc_to_kcrs(p.data), requires_grad=True) for name, p in model.named_parameters()}


def torch_sgd(twin, kinds, lr, momentum, weight_decay, nesterov, norm_weight_decay):
    if norm_weight_decay is None:
        return torch.optim.SGD(list(twin.values()), lr=lr, momentum=momentum, weight_decay=weight_decay,
                               nesterov=nesterov)
    decayed = [t for n, t in twin.items() if kinds[n] == "weight"]
    exempt = [t for n, t in twin.items() if kinds[n] != "weight"]
    return torch.optim.SGD([{"params": decayed}, {"params": exempt, "weight_decay": norm_weight_decay}],
                           lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)


SGD_CONFIGS = {
    "plain": dict(momentum=0.0, weight_decay=0.0),
    "momentum": dict(momentum=0.9),
    "momentum_wd": dict(momentum=0.9, weight_decay=0.05),
    "wd_no_momentum": dict(momentum=0.0, weight_decay=0.05),
    "nesterov_wd": dict(momentum=0.8, weight_decay=0.05, nesterov=True),
    "norm_wd_0": dict(momentum=0.9, weight_decay=0.05, norm_weight_decay=0.0),
    "norm_wd_0_nesterov": dict(momentum=0.9, weight_decay=0.05, norm_weight_decay=0.0, nesterov=True),
    "norm_wd_other": dict(momentum=0.9, weight_decay=0.01, norm_weight_decay=0.2),
    "grad_scale": dict(momentum=0.9, weight_decay=0.05, grad_scale=0.25),
    "grad_scale_norm_wd_0": dict(momentum=0.9, weight_decay=0.05, norm_weight_decay=0.0, grad_scale=0.125),
}


@pytest.mark.parametrize("config", sorted(SGD_CONFIGS))
def test_sgd_matches_torch(config):
    options = dict(momentum=0.9, weight_decay=0.0, nesterov=False, norm_weight_decay=None, grad_scale=1.0)
    options.update(SGD_CONFIGS[config])
    model = small_net()
    kinds = {n: p.kind for n, p in model.named_parameters()}
    twin = torch_twin(model)
    lr = 0.1
    opt = SGD(model.parameters(), lr=lr, align=64, **options)
    ref = torch_sgd(twin, kinds, lr, options["momentum"], options["weight_decay"], options["nesterov"],
                    options["norm_weight_decay"])
    r = rng(53)
    for step, new_lr in enumerate([0.1, 0.1, 0.05, 0.05, 0.2]):  # the lr changes between steps
        opt.lr = new_lr
        for group in ref.param_groups:
            group["lr"] = new_lr
        opt.zero_grad()
        for name, p in model.named_parameters():
            g = r.standard_normal(p.shape)
            p.grad.data[...] = g
            twin[name].grad = torch.from_numpy(krsc_to_kcrs(options["grad_scale"] * g))
        opt.step()
        ref.step()
        for name, p in model.named_parameters():
            np.testing.assert_allclose(p.data, kcrs_to_krsc(twin[name].detach().numpy()), rtol=1e-12, atol=1e-14,
                                       err_msg=f"{name} after step {step}")
    np.testing.assert_array_equal(opt.flat.data[sum(p.size for p in model.parameters()):], 0)


def test_training_loop_matches_torch():
    """Forward, loss, backward, step, three times: minidl model + SGD vs torch model + torch SGD."""
    model = small_net(seed=3)
    reference = TorchSmallNet().double()
    copy_to_torch(model, reference)
    kinds = {n: p.kind for n, p in model.named_parameters()}
    opt = SGD(model.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-2, norm_weight_decay=0.0, align=128)
    ref = torch_sgd(dict(reference.named_parameters()), kinds, 0.2, 0.9, 1e-2, False, 0.0)
    r = rng(54)
    for step in range(3):
        x, labels = r.standard_normal((4, 6, 6, 3)), r.integers(0, 3, size=4)
        opt.zero_grad()
        ops.softmax_cross_entropy(model(Tensor(x)), labels, label_smoothing=0.1).backward()
        opt.step()
        ref.zero_grad()
        torch.nn.functional.cross_entropy(reference(nhwc_to_nchw(x)), torch.from_numpy(labels),
                                          label_smoothing=0.1).backward()
        ref.step()
    ref_params = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.data, kcrs_to_krsc(ref_params[name].detach().numpy()), rtol=1e-9, atol=1e-12,
                                   err_msg=name)
    ref_buffers = dict(reference.named_buffers())
    for name, array in model.named_buffers():
        np.testing.assert_allclose(array, ref_buffers[name].numpy(), rtol=1e-9, atol=1e-12, err_msg=name)
