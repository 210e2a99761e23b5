"""Shared test helpers: finite-difference gradient checks, NHWC/KRSC <-> torch conversions, and
the residual blocks as written with unfused ops (the oracle of the fused ones).

The oracles run in float64 on NumPy: central finite differences and PyTorch on the CPU, never
minidl itself (the unfused blocks also serve the GPU checks of tests/kernels).
"""
import numpy as np

from minidl import Tensor, no_grad, ops


def rng(seed=0):
    return np.random.default_rng(seed)


def assert_close(actual, expected, rtol=1e-6, atol_scale=1e-9, name=""):
    """Elementwise relative check; the absolute floor is tiny and scaled by the largest
    expected magnitude, so values that cancel to ~0 do not need to match to 1e-6 relative."""
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    atol = atol_scale * max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=name)


def numeric_grad(f, arrays, index, eps=1e-6):
    """Central differences of the scalar f(*arrays) with respect to arrays[index]."""
    x = arrays[index]
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    assert np.shares_memory(flat, x), "perturbations must reach the array f reads"
    for i in range(flat.size):
        saved = flat[i]
        flat[i] = saved + eps
        plus = f(*arrays)
        flat[i] = saved - eps
        minus = f(*arrays)
        flat[i] = saved
        gflat[i] = (plus - minus) / (2 * eps)
    return grad


def check_gradients(op, *arrays, seed=0, rtol=1e-5, atol=1e-7, eps=1e-6):
    """Check the analytic gradient of L = sum(op(*inputs) * R), R fixed random weights, with
    respect to EVERY input, against central differences in float64.

    `op` takes Tensors and returns a Tensor; `arrays` are float64 arrays (copied here)."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    with no_grad():
        out_shape = op(*[Tensor(a.copy()) for a in arrays]).shape
    weights = rng(seed + 1000).standard_normal(out_shape)

    def loss_value(*values):
        with no_grad():
            out = op(*[Tensor(v) for v in values])
        return float(np.sum(np.asarray(out.data) * weights))

    tensors = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    loss = (op(*tensors) * Tensor(weights)).sum()
    np.testing.assert_allclose(loss.item(), loss_value(*arrays), rtol=1e-12, atol=1e-12)
    loss.backward()
    for index, tensor in enumerate(tensors):
        assert tensor.grad is not None, f"input {index} got no gradient"
        expected = numeric_grad(loss_value, [a.copy() for a in arrays], index, eps)
        assert tensor.grad.shape == arrays[index].shape, f"input {index}: gradient shape"
        np.testing.assert_allclose(tensor.grad.data, expected, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {index}")


def away_from_zero(shape, seed=0, margin=0.1):
    """Random values with |x| >= margin: no input sits on a kink (ReLU)."""
    r = rng(seed)
    return r.choice([-1.0, 1.0], size=shape) * (margin + np.abs(r.standard_normal(shape)))


def distinct(shape, seed=0, spacing=0.01):
    """Random values, all distinct by at least `spacing`: no ties inside a pooling window."""
    r = rng(seed)
    n = int(np.prod(shape))
    return (r.permutation(n).reshape(shape) - n / 2) * spacing


# --- layout conversions at the torch boundary -------------------------------------------------

def nhwc_to_nchw(array):
    import torch
    return torch.from_numpy(np.ascontiguousarray(np.asarray(array).transpose(0, 3, 1, 2)))


def nchw_to_nhwc(tensor):
    return tensor.detach().numpy().transpose(0, 2, 3, 1)


def krsc_to_kcrs(array):
    """A minidl (out, kh, kw, in) weight as a torch (out, in, kh, kw) one; other ranks unchanged."""
    array = np.asarray(array)
    return np.ascontiguousarray(array.transpose(0, 3, 1, 2)) if array.ndim == 4 else array.copy()


def kcrs_to_krsc(array):
    array = np.asarray(array)
    return array.transpose(0, 2, 3, 1) if array.ndim == 4 else array


def copy_to_torch(minidl_module, torch_module):
    """Load every minidl parameter and buffer into the torch module BY NAME (layouts converted);
    every torch parameter must be covered."""
    import torch
    ours = minidl_module.state_dict()
    theirs = {k: v for k, v in torch_module.state_dict().items() if not k.endswith("num_batches_tracked")}
    assert set(ours) == set(theirs), (sorted(set(ours) ^ set(theirs)))[:10]
    converted = {name: torch.from_numpy(krsc_to_kcrs(array)) for name, array in ours.items()}
    torch_module.load_state_dict(converted, strict=False)
    for name in theirs:
        assert torch.equal(torch_module.state_dict()[name], converted[name]), name


# --- the residual blocks without fused ops ------------------------------------------------------

def unfused_block_forward(block, x):
    """A BasicBlock's or Bottleneck's forward written with the unfused ops, as the blocks were
    before minidl.ops.norm_relu: every BN, ReLU and addition its own op (float data only)."""
    out = ops.relu(block.bn1(block.conv1(x)))
    if hasattr(block, "conv3"):
        out = ops.relu(block.bn2(block.conv2(out)))
        out = block.bn3(block.conv3(out))
    else:
        out = block.bn2(block.conv2(out))
    identity = x if block.downsample is None else block.downsample(x)
    return ops.relu(ops.add(out, identity))
