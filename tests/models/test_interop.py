"""Weights to and from torchvision's layout: the oracle is the plain-torch twin of our ResNets
(torchvision's module names, minidl.bench.torch_resnet), which must load our .npz strictly and
give our logits; and a torch model's weights must give its logits here."""
import numpy as np
import pytest
import torch

from helpers import assert_close, nhwc_to_nchw, rng
from minidl import Tensor, models, nn, no_grad
from minidl.models import export_torchvision, import_torchvision
from minidl.optim import SGD
from minidl.bench.torch_resnet import torch_resnet
from training.test_checkpoint import one_line_error
from test_models import randomize_norm_state

CLASSES = 10
TORCHVISION_MODELS = ["resnet50", "resnet18"]  # resnet20/32/56 are not torchvision models


def npz_state(path):
    with np.load(path) as npz:
        return {name: npz[name] for name in npz.files}


def assert_same_logits(ours, theirs, seed):
    """Eval-mode logits of both models on the same image batch (NHWC here, NCHW there)."""
    x = rng(seed).standard_normal((2, 64, 64, 3)).astype(np.float32)
    ours.eval(), theirs.eval()
    with no_grad():
        logits = ours(Tensor(x)).data
    with torch.no_grad():
        expected = theirs(nhwc_to_nchw(x)).numpy()
    assert np.ptp(expected) > 1e-3  # the classes really differ: a wrong weight would show
    assert_close(logits, expected, rtol=2e-4, atol_scale=2e-5, name="logits")


@pytest.mark.parametrize("name", TORCHVISION_MODELS)
def test_export_loads_strictly_into_torch_with_the_same_logits(tmp_path, name):
    nn.manual_seed(11)
    ours = getattr(models, name)(num_classes=CLASSES)
    randomize_norm_state(ours, seed=12)
    export_torchvision(ours, tmp_path / "w.npz")
    state = npz_state(tmp_path / "w.npz")
    theirs = torch_resnet(name, CLASSES)
    assert sorted(state) == sorted(theirs.state_dict())
    for key, array in state.items():
        expected = (np.int64, ()) if key.endswith("num_batches_tracked") else (np.float32, array.shape)
        assert (array.dtype, array.shape) == expected, key
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    assert_same_logits(ours, theirs, seed=13)


def perturbed_torch_model(name, seed):
    """A torch model whose every parameter and BN statistic is random and far from its init."""
    torch.manual_seed(seed)
    model = torch_resnet(name, CLASSES)
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            if key.endswith("running_var"):
                tensor.uniform_(0.5, 1.5)
            elif key.endswith("num_batches_tracked"):
                tensor.fill_(1234)
            else:
                tensor.add_(0.05 * torch.randn_like(tensor))
    return model


@pytest.mark.parametrize("name", TORCHVISION_MODELS)
def test_import_from_torch_gives_its_logits_in_place(tmp_path, name):
    theirs = perturbed_torch_model(name, seed=21)
    np.savez(tmp_path / "w.npz", **{k: v.numpy() for k, v in theirs.state_dict().items()})
    nn.manual_seed(22)
    ours = getattr(models, name)(num_classes=CLASSES)
    opt = SGD(ours.parameters(), lr=0.1)
    import_torchvision(ours, tmp_path / "w.npz")
    for p in opt.params:  # the optimizer's flat buffer holds the imported weights
        assert np.shares_memory(p.data, opt.flat.data)
    np.testing.assert_array_equal(ours.fc.weight.data, theirs.fc.weight.detach().numpy())
    assert_same_logits(ours, theirs, seed=23)


def test_minidl_round_trip_is_bit_exact(tmp_path):
    nn.manual_seed(31)
    source = models.resnet20(num_classes=CLASSES)
    randomize_norm_state(source, seed=32)
    export_torchvision(source, tmp_path / "w.npz")
    nn.manual_seed(33)
    target = models.resnet20(num_classes=CLASSES)
    import_torchvision(target, tmp_path / "w.npz")
    for (name, a), (_, b) in zip(source.state_dict().items(), target.state_dict().items()):
        assert a.tobytes() == b.tobytes(), name


@pytest.fixture
def resnet20_npz(tmp_path):
    nn.manual_seed(41)
    path = tmp_path / "w.npz"
    export_torchvision(models.resnet20(num_classes=CLASSES), path)
    return path


def edited(path, change):
    state = npz_state(path)
    change(state)
    np.savez(path, **state)
    return path


def test_counters_are_optional_on_import(resnet20_npz):
    edited(resnet20_npz, lambda s: [s.pop(k) for k in list(s) if k.endswith("num_batches_tracked")])
    import_torchvision(models.resnet20(num_classes=CLASSES), resnet20_npz)


@pytest.mark.parametrize("change,words", [
    (lambda s: s.pop("layer2.0.downsample.1.running_var"), ["lacks layer2.0.downsample.1.running_var", "1 missing"]),
    (lambda s: s.update(extra=np.zeros(1)), ["has extra", "1 unexpected"]),
    (lambda s: s.update({"layer1.0.conv1.weight": s["layer1.0.conv1.weight"].transpose(0, 2, 3, 1)}),
     ["layer1.0.conv1.weight of shape [16, 3, 3, 16] where this model needs [16, 16, 3, 3]"]),
], ids=["missing", "unexpected", "minidl_layout"])
def test_mismatched_weights_are_one_line_errors(resnet20_npz, change, words):
    edited(resnet20_npz, change)
    model = models.resnet20(num_classes=CLASSES)
    one_line_error(lambda: import_torchvision(model, resnet20_npz), str(resnet20_npz), *words)


def test_other_number_of_classes_is_refused_and_leaves_the_model_untouched(resnet20_npz):
    model = models.resnet20(num_classes=5)
    before = {name: np.array(array) for name, array in model.state_dict().items()}
    one_line_error(lambda: import_torchvision(model, resnet20_npz),
                   "fc.weight of shape [10, 64] where this model needs [5, 64]", "number of classes")
    for name, array in model.state_dict().items():
        np.testing.assert_array_equal(array, before[name], err_msg=name)


@pytest.mark.parametrize("content,words", [
    (None, ["does not exist"]), (b"PK\x03\x04 cut short", ["not a readable .npz"]), (b"hello", ["not a readable .npz"]),
], ids=["missing", "broken_zip", "text"])
def test_unreadable_files_are_one_line_errors(tmp_path, content, words):
    path = tmp_path / "w.npz"
    if content is not None:
        path.write_bytes(content)
    one_line_error(lambda: import_torchvision(models.resnet20(num_classes=CLASSES), path), str(path), *words)
