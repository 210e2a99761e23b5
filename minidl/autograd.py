"""A small define-by-run autograd engine (DeZero-sized).

A `Tensor` wraps an array (`.data`, NumPy or CuPy) and, after `backward()`, its gradient
(`.grad`); every differentiable operation is a `Function` whose call records it as the
`creator` of its outputs, and `backward()` walks that graph from the loss to the leaves,
highest `generation` first. Gradients accumulate; a leaf whose `.grad` exists (a view into
the optimizer's flat buffer) is accumulated into IN PLACE, which keeps that view valid.
Hooks (`grad_hook`, `set_scope`, `set_backward_observer`) are None by default.

Details: docs/design.md, "minidl/autograd.py".
"""
import contextlib
import heapq
import weakref

import numpy

from minidl import kernels
from minidl.backend import BF16, get_array_module

_grad_enabled = True
_scope = None
_backward_observer = None


@contextlib.contextmanager
def no_grad():
    """Run operations without recording the graph (evaluation, optimizer updates)."""
    global _grad_enabled
    previous, _grad_enabled = _grad_enabled, False
    try:
        yield
    finally:
        _grad_enabled = previous


def is_grad_enabled():
    return _grad_enabled


def set_scope(tag):
    """Tag the Functions recorded from now on with `tag` (None: no tag); returns the previous tag."""
    global _scope
    previous, _scope = _scope, tag
    return previous


def set_backward_observer(before=None, after=None):
    """Have backward call before(function) and after(function) around each Function's backward
    (no arguments: call nothing)."""
    global _backward_observer
    _backward_observer = (before, after) if before is not None else None


def as_array(value, like=None):
    """A scalar or array as an array of the same module (and dtype) as `like`."""
    if like is not None:
        return get_array_module(like).asarray(value, dtype=like.dtype)
    if hasattr(value, "shape") and not isinstance(value, numpy.generic):
        return value
    return numpy.asarray(value)  # Python and NumPy scalars become 0-d arrays


class Tensor:
    __array_priority__ = 200  # numpy_array + tensor dispatches to Tensor.__radd__
    grad_hook = None  # called as grad_hook(tensor) after each accumulation into .grad

    def __init__(self, data, requires_grad=False):
        self.data = as_array(data)
        self.grad = None
        self.requires_grad = requires_grad
        self.creator = None
        self.generation = 0

    shape = property(lambda self: self.data.shape)
    ndim = property(lambda self: self.data.ndim)
    dtype = property(lambda self: self.data.dtype)
    size = property(lambda self: self.data.size)

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor({self.data!r}{grad})"

    def item(self):
        return float(self.data)

    def set_creator(self, function):
        self.creator = function
        self.generation = function.generation + 1

    def backward(self, grad=None):
        """Accumulate d(self)/d(leaf) into the `.grad` of every leaf that requires grad."""
        if grad is None:
            grad = get_array_module(self.data).ones_like(self.data)
        _accumulate(self, grad.data if isinstance(grad, Tensor) else grad)

        pending, seen, tie = [], set(), 0
        waiting = {}  # creator -> the outputs holding its incoming grads, alive until it runs

        def push(function):
            nonlocal tie
            if function not in seen:
                seen.add(function)
                tie += 1  # equal generations pop in insertion order; Functions never compare
                heapq.heappush(pending, (-function.generation, tie, function))

        if self.creator is not None:
            push(self.creator)
        before, after = _backward_observer or (None, None)
        while pending:
            function = heapq.heappop(pending)[2]
            outputs = [output() for output in function.outputs]
            waiting.pop(function, None)
            grads_out = [None if y is None or y.grad is None else y.grad.data for y in outputs]
            if before is not None:
                before(function)
            grads_in = function.backward(*grads_out)
            if after is not None:
                after(function)
            if not isinstance(grads_in, tuple):
                grads_in = (grads_in,)
            for x, gx in zip(function.inputs, grads_in):
                if x.requires_grad and gx is not None:
                    _accumulate(x, gx)
                    if x.creator is not None:
                        waiting.setdefault(x.creator, {})[id(x)] = x
                        push(x.creator)
            for y in outputs:  # an intermediate's gradient is consumed: release it
                if y is not None and y is not self:
                    y.grad = None
            function.release()

    # arithmetic; the functions are defined below
    def __add__(self, other):
        return add(self, other)

    def __radd__(self, other):
        return add(other, self)

    def __mul__(self, other):
        return mul(self, other)

    def __rmul__(self, other):
        return mul(other, self)

    def __sub__(self, other):
        return sub(self, other)

    def __rsub__(self, other):
        return sub(other, self)

    def __neg__(self):
        return mul(self, -1.0)

    def sum(self):
        return sum_all(self)

    def mean(self):
        return mean_all(self)


def _accumulate(tensor, grad):
    if tensor.grad is None:
        # a leaf keeps its own copy: the same array may be handed to several inputs
        tensor.grad = Tensor(grad.copy() if tensor.creator is None else grad)
    elif tensor.creator is None:
        tensor.grad.data += grad  # in place: parameter grads are views into a flat buffer
    else:
        tensor.grad = Tensor(_add_gradients(tensor.grad.data, grad))
    if tensor.grad_hook is not None:
        tensor.grad_hook(tensor)


def _add_gradients(a, b):
    """a + b; bf16 gradients (uint16 bits, --amp) are summed by their kernel, not as integers:
    a residual block's input, read by both branches, receives two."""
    if a.dtype == BF16:
        return kernels.active().bf16_add(a, b)
    return a + b


def as_tensor(value, like=None):
    if isinstance(value, Tensor):
        return value
    return Tensor(as_array(value, like.data if like is not None else None))


class Function:
    """One differentiable operation. Subclasses implement forward(*arrays) -> array(s)
    and backward(*grad_outputs) -> grad_input(s), and keep what backward needs as attributes.
    Returning None for an input's gradient means it needs none."""
    scope = None  # the tag set (set_scope) when it was recorded

    def __call__(self, *inputs):
        first = next((x for x in inputs if isinstance(x, Tensor)), None)
        inputs = [as_tensor(x, first) for x in inputs]
        outputs = self.forward(*[x.data for x in inputs])
        single = not isinstance(outputs, tuple)
        outputs = [Tensor(y) for y in ((outputs,) if single else outputs)]
        if _grad_enabled and any(x.requires_grad for x in inputs):
            self.generation = max(x.generation for x in inputs)
            for y in outputs:
                y.requires_grad = True
                y.set_creator(self)
            self.inputs = inputs
            self.outputs = [weakref.ref(y) for y in outputs]
            if _scope is not None:
                self.scope = _scope
        return outputs[0] if single else outputs

    def forward(self, *arrays):
        raise NotImplementedError

    def backward(self, *grad_outputs):
        raise NotImplementedError

    def release(self):
        """Drop everything kept for backward (inputs, saved arrays): frees activations early."""
        self.__dict__.clear()


def sum_to(array, shape):
    """Sum a broadcast gradient back down to `shape` (the inverse of broadcasting)."""
    if array.shape == shape:
        return array
    lead = array.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape) if n == 1)
    return array.sum(axis=axes, keepdims=True).reshape(shape)


class Add(Function):
    def forward(self, a, b):
        self.shapes = a.shape, b.shape
        return a + b

    def backward(self, gy):
        return sum_to(gy, self.shapes[0]), sum_to(gy, self.shapes[1])


class Sub(Function):
    def forward(self, a, b):
        self.shapes = a.shape, b.shape
        return a - b

    def backward(self, gy):
        return sum_to(gy, self.shapes[0]), sum_to(-gy, self.shapes[1])


class Mul(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        return a * b

    def backward(self, gy):
        return sum_to(gy * self.b, self.a.shape), sum_to(gy * self.a, self.b.shape)


class SumAll(Function):
    def forward(self, x):
        self.shape = x.shape
        return x.sum()

    def backward(self, gy):
        return get_array_module(gy).broadcast_to(gy, self.shape).copy()


class MeanAll(Function):
    def forward(self, x):
        self.shape = x.shape
        return x.mean()

    def backward(self, gy):
        xp = get_array_module(gy)
        return xp.broadcast_to(gy / numpy.prod(self.shape), self.shape).copy()


def add(a, b):
    return Add()(a, b)


def sub(a, b):
    return Sub()(a, b)


def mul(a, b):
    return Mul()(a, b)


def sum_all(x):
    return SumAll()(x)


def mean_all(x):
    return MeanAll()(x)
