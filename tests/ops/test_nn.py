"""Module bookkeeping that models and checkpoints rely on: buffers stay registered, in order,
through dtype conversion and reassignment."""
import numpy as np

from minidl import models, nn


def test_astype_converts_parameters_and_buffers():
    model = models.resnet20(num_classes=10)
    names = list(model.state_dict())
    values = {k: np.array(v) for k, v in model.state_dict().items()}
    model.astype(np.float64)
    assert list(model.state_dict()) == names
    for name, array in model.state_dict().items():
        assert array.dtype == np.float64, name
        np.testing.assert_array_equal(array, values[name], err_msg=name)
    assert model.bn1.running_mean is dict(model.named_buffers())["bn1.running_mean"]  # forward uses the new one


def test_reassigned_buffer_stays_a_buffer():
    """As in torch: assigning an array to a buffer's name replaces the buffer, it does not
    silently drop it from state_dict (a checkpoint would then lack the running statistics)."""
    bn = nn.BatchNorm2d(3)
    fresh = np.full(3, 0.5, dtype=np.float32)
    bn.running_mean = fresh
    assert [name for name, _ in bn.named_buffers()] == ["running_mean", "running_var"]
    assert bn.state_dict()["running_mean"] is fresh
