"""Modules, parameters and layers.

A `Module` records its parameters, buffers and submodules in the order they are assigned,
so every process that builds the same model lists them in the same order: the flat
optimizer buffers and the gradient all-reduce rely on that. Names follow torch's. Initial
values come from one host generator seeded by `manual_seed`, so the same seed gives the same
model on CPU and GPU. `Module.call_hook` (None by default) can wrap every module call.

Details: docs/design.md, "minidl/nn.py".
"""
import math
from collections import OrderedDict

import numpy

from minidl import ops
from minidl.autograd import Tensor
from minidl.backend import xp

_init_rng = numpy.random.default_rng(0)
DEFAULT_DTYPE = numpy.float32


def manual_seed(seed):
    """Seed the generator that initializes parameters."""
    global _init_rng
    _init_rng = numpy.random.default_rng(seed)


def init_normal(shape, std):
    return xp.asarray(_init_rng.normal(0.0, std, size=shape).astype(DEFAULT_DTYPE))


def init_uniform(shape, bound):
    return xp.asarray(_init_rng.uniform(-bound, bound, size=shape).astype(DEFAULT_DTYPE))


class Parameter(Tensor):
    """A trainable tensor. `kind` is "weight", "bias" or "norm" (a normalization layer's γ or β):
    optimizers use it to exempt biases and norm parameters from weight decay."""

    def __init__(self, data, kind="weight"):
        super().__init__(data, requires_grad=True)
        self.kind = kind


class Module:
    call_hook = None

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if name in self._buffers and not isinstance(value, (Parameter, Module)):
            self._buffers[name] = value  # reassigning a buffer keeps it a buffer, as in torch
            object.__setattr__(self, name, value)
            return
        for registry in (self._parameters, self._buffers, self._modules):
            registry.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def register_buffer(self, name, array):
        """State that is saved but not trained (BN running statistics)."""
        self._buffers[name] = array
        object.__setattr__(self, name, array)

    def __call__(self, *args):
        if Module.call_hook is None:
            return self.forward(*args)
        return Module.call_hook(self, args)

    def forward(self, *args):
        raise NotImplementedError

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, module in self._modules.items():
            yield from module.named_modules(f"{prefix}{name}.")

    def named_parameters(self):
        for prefix, module in self.named_modules():
            for name, parameter in module._parameters.items():
                yield prefix + name, parameter

    def parameters(self):
        return [parameter for _, parameter in self.named_parameters()]

    def named_buffers(self):
        for prefix, module in self.named_modules():
            for name in module._buffers:
                yield prefix + name, getattr(module, name)

    def train(self, mode=True):
        for _, module in self.named_modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        """Zero the gradients in place (they may be views into an optimizer's flat buffer)."""
        for parameter in self.parameters():
            if parameter.grad is not None:
                parameter.grad.data[...] = 0

    def state_dict(self):
        """name -> array for every parameter and buffer (the arrays themselves, not copies)."""
        state = OrderedDict((name, p.data) for name, p in self.named_parameters())
        state.update(self.named_buffers())
        return state

    def load_state_dict(self, state):
        """Copy values in place (keeps flat-buffer views valid); names and shapes must match."""
        own = self.state_dict()
        missing, unexpected = own.keys() - state.keys(), state.keys() - own.keys()
        if missing or unexpected:
            raise KeyError(f"state dict mismatch: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        for name, array in own.items():
            if array.shape != tuple(state[name].shape):
                raise ValueError(f"{name}: shape {tuple(state[name].shape)} where {array.shape} is expected")
            array[...] = xp.asarray(state[name])

    def astype(self, dtype):
        """Convert every parameter and buffer (before an optimizer takes the parameters)."""
        for _, module in self.named_modules():
            for parameter in module._parameters.values():
                parameter.data = parameter.data.astype(dtype)
            for name, array in list(module._buffers.items()):
                setattr(module, name, array.astype(dtype))
        return self

    def num_parameters(self):
        return sum(p.size for p in self.parameters())


class Sequential(Module):
    def __init__(self, *modules):
        super().__init__()
        for index, module in enumerate(modules):
            setattr(self, str(index), module)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, index):
        return list(self._modules.values())[index]

    def forward(self, x):
        for module in self._modules.values():
            x = module(x)
        return x


class Conv2d(Module):
    """NHWC convolution with a KRSC weight (out, kernel_h, kernel_w, in); torch's default init."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True):
        super().__init__()
        self.stride, self.padding = stride, padding
        bound = 1 / math.sqrt(in_channels * kernel_size * kernel_size)
        self.weight = Parameter(init_uniform((out_channels, kernel_size, kernel_size, in_channels), bound))
        self.bias = Parameter(init_uniform((out_channels,), bound), kind="bias") if bias else None

    def forward(self, x):
        return ops.conv2d(x, self.weight, self.bias, self.stride, self.padding)


class BatchNorm2d(Module):
    """`group_size`: in training, statistics over groups of that many images (ghost batch norm)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, group_size=None):
        super().__init__()
        self.eps, self.momentum, self.group_size = eps, momentum, group_size
        self.weight = Parameter(xp.ones(num_features, dtype=DEFAULT_DTYPE), kind="norm")
        self.bias = Parameter(xp.zeros(num_features, dtype=DEFAULT_DTYPE), kind="norm")
        self.register_buffer("running_mean", xp.zeros(num_features, dtype=DEFAULT_DTYPE))
        self.register_buffer("running_var", xp.ones(num_features, dtype=DEFAULT_DTYPE))

    def forward(self, x):
        return ops.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,
                              self.training, self.momentum, self.eps, self.group_size)


class Linear(Module):
    """y = x @ weight.T + bias, weight (out_features, in_features); torch's default init."""

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        bound = 1 / math.sqrt(in_features)
        self.weight = Parameter(init_uniform((out_features, in_features), bound))
        self.bias = Parameter(init_uniform((out_features,), bound), kind="bias") if bias else None

    def forward(self, x):
        return ops.linear(x, self.weight, self.bias)


class ReLU(Module):
    def forward(self, x):
        return ops.relu(x)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride, padding=0):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x):
        return ops.max_pool2d(x, self.kernel_size, self.stride, self.padding)


class GlobalAvgPool(Module):
    def forward(self, x):
        return ops.global_avg_pool(x)
