"""The model's backward, as the simulation needs it: which parameters each layer holds, what each
layer costs forward and backward (FLOPs per image), and the order backward runs the layers in.

The real model is built (its parameters in registration order, as the flat buffer lays them out)
and the image's size is followed through its layers: no forward pass runs. Backward runs the
layers deepest generation first, as autograd does; a parameter's gradient is final when its
layer's backward ends.

Details: docs/plan.md, "The model's backward".
"""
import dataclasses
import functools

from minidl import nn
from minidl.models import MODELS, BasicBlock, Bottleneck

NORM_FORWARD_FLOPS, NORM_BACKWARD_FLOPS = 8, 12  # batch norm + ReLU per element: statistics, scale, shift, max


@dataclasses.dataclass(frozen=True)
class Layer:
    name: str
    parameters: tuple  # indices into the model's parameters (registration order)
    forward_flops: float  # per image
    backward_flops: float
    generation: int  # depth from the input, as autograd numbers its Functions


@dataclasses.dataclass(frozen=True)
class Profile:
    model_name: str
    image_size: int
    model: object  # the built model (its parameters give the flat buffer)
    parameter_names: tuple
    layers: tuple  # in the order backward runs them

    @property
    def forward_flops(self):
        return sum(layer.forward_flops for layer in self.layers)

    @property
    def backward_flops(self):
        return sum(layer.backward_flops for layer in self.layers)

    @property
    def num_parameters(self):
        return self.model.num_parameters()

    def final_fractions(self):
        """For each parameter, the fraction of backward after which its gradient is final."""
        fractions, done = [1.0] * len(self.parameter_names), 0.0
        for layer in self.layers:
            done += layer.backward_flops / self.backward_flops
            for index in layer.parameters:
                fractions[index] = min(done, 1.0)
        return fractions


@functools.lru_cache(maxsize=None)
def profile(model_name, image_size, num_classes=1000):
    """The Profile of MODELS[model_name] on square images of `image_size` pixels."""
    nn.manual_seed(0)
    model = MODELS[model_name](num_classes=num_classes)
    names = tuple(name for name, _ in model.named_parameters())
    return Profile(model_name, image_size, model, names, tuple(backward_order(ShapeWalk(model, image_size).layers)))


def backward_order(forward_layers):
    """The deepest generation first; within one, the later layer of the forward first."""
    indexed = list(enumerate(forward_layers))
    return [layer for _, layer in sorted(indexed, key=lambda item: (-item[1].generation, -item[0]))]


class ShapeWalk:
    """Follows the image's size through a minidl.models.ResNet, costing each layer on the way;
    `layers` in forward order."""

    def __init__(self, model, image_size):
        self.index = {name: i for i, (name, _) in enumerate(model.named_parameters())}
        self.layers = []
        size = self.add("conv1", model.conv1, image_size, 1, input_needs_grad=False)
        self.add("bn1", model.bn1, size, 2)
        if model.maxpool is not None:
            pool = model.maxpool
            size = (size + 2 * pool.padding - pool.kernel_size) // pool.stride + 1
        generation = 2
        for stage in range(1, model.num_stages + 1):
            for number, block in enumerate(getattr(model, f"layer{stage}")):
                size, generation = self.block(f"layer{stage}.{number}", block, size, generation)
        self.add("fc", model.fc, 1, generation + 1)

    def add(self, name, module, size, generation, input_needs_grad=True):
        """Cost `module` on a size x size input; its output's size."""
        params = tuple(self.index[f"{name}.{p}"] for p, _ in module.named_parameters())
        if isinstance(module, nn.Conv2d):
            k, r, s, c = module.weight.shape
            size = (size + 2 * module.padding - r) // module.stride + 1
            forward = 2.0 * size * size * k * r * s * c
            backward = forward * (2 if input_needs_grad else 1)  # the weight's gradient (and the input's)
        elif isinstance(module, nn.BatchNorm2d):
            elements = size * size * module.weight.shape[0]
            forward, backward = NORM_FORWARD_FLOPS * elements, NORM_BACKWARD_FLOPS * elements
        elif isinstance(module, nn.Linear):
            forward = 2.0 * module.weight.shape[0] * module.weight.shape[1]
            backward = 2 * forward
        else:
            raise ValueError(f"no cost for {type(module).__name__} {name}")
        self.layers.append(Layer(name, params, forward, backward, generation))
        return size

    def block(self, prefix, block, size, generation):
        """A residual block: its convolutions in a chain, each followed by its batch norm, and the
        projection shortcut beside them from the block's input; (output size, output generation)."""
        if not isinstance(block, (BasicBlock, Bottleneck)):
            raise ValueError(f"no cost for {type(block).__name__} {prefix}")
        out, depth = size, generation
        for number in range(1, 4 if isinstance(block, Bottleneck) else 3):
            out = self.add(f"{prefix}.conv{number}", getattr(block, f"conv{number}"), out, depth + 1)
            self.add(f"{prefix}.bn{number}", getattr(block, f"bn{number}"), out, depth + 2)
            depth += 2
        if block.downsample is not None:
            conv, bn = block.downsample
            shortcut = self.add(f"{prefix}.downsample.0", conv, size, generation + 1)
            self.add(f"{prefix}.downsample.1", bn, shortcut, generation + 2)
        return out, depth
