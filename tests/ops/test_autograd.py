"""The autograd engine: accumulation, graph order, no_grad, in-place leaf gradients, memory.

Oracles are closed-form derivatives; the order tests record which Function ran when.
"""
import weakref

import numpy as np
import pytest

from helpers import rng
from minidl import Function, Tensor, no_grad, ops
from minidl.autograd import is_grad_enabled


class Probe(Function):
    """Identity that logs its tag when its backward runs; optionally calls a hook then."""

    def __init__(self, tag, log, hook=None):
        self.tag, self.log, self.hook = tag, log, hook

    def forward(self, x):
        return x.copy()

    def backward(self, gy):
        self.log.append(self.tag)
        if self.hook is not None:
            self.hook()
        return gy


def test_tensor_used_twice_accumulates():
    x0 = rng(40).standard_normal((3, 4))
    x = Tensor(x0.copy(), requires_grad=True)
    (x * x + x).sum().backward()
    np.testing.assert_allclose(x.grad.data, 2 * x0 + 1, rtol=1e-14)


def test_same_tensor_twice_in_one_function():
    x = Tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True)
    (x * x * x).sum().backward()
    np.testing.assert_allclose(x.grad.data, 3 * x.data ** 2, rtol=1e-14)


def test_diamond():
    """x -> a -> (b, c) -> d: both paths must arrive at a before a's creator runs."""
    x0 = rng(41).standard_normal(5)
    x = Tensor(x0.copy(), requires_grad=True)
    a = x * 2.0
    b = a * a
    c = a * 3.0
    (b * c).sum().backward()  # d = 3 a^3 = 24 x^3
    np.testing.assert_allclose(x.grad.data, 72 * x0 ** 2, rtol=1e-13)


def test_nested_diamonds_with_broadcasting():
    x0, w0 = rng(42).standard_normal((2, 3)), rng(43).standard_normal(3)
    x, w = Tensor(x0.copy(), requires_grad=True), Tensor(w0.copy(), requires_grad=True)
    h = x * w            # (2, 3)
    g = h + w            # w used twice, broadcast twice
    (g * h - w).sum().backward()
    # L = sum_ij (x w + w)(x w) - 2 sum_j w
    np.testing.assert_allclose(x.grad.data, (2 * x0 * w0 + w0) * w0, rtol=1e-13)
    np.testing.assert_allclose(w.grad.data, (2 * x0 ** 2 * w0 + 2 * x0 * w0).sum(axis=0) - 2, rtol=1e-13)


def test_long_skip_connection_waits_for_the_deep_path():
    """t feeds a 60-op chain AND the final sum directly; t's creator may only run after both."""
    depth, factor = 60, 1.01
    x = Tensor(np.array([0.5, -1.5]), requires_grad=True)
    t = x * 1.0
    h = t
    for _ in range(depth):
        h = h * factor
    (h + t).sum().backward()
    np.testing.assert_allclose(x.grad.data, [factor ** depth + 1] * 2, rtol=1e-12)


def test_deep_chain_is_iterative():
    """Far deeper than Python's recursion limit would allow a recursive backward."""
    x = Tensor(np.ones(3), requires_grad=True)
    h = x
    for _ in range(3000):
        h = h + 1.0
    h.sum().backward()
    np.testing.assert_array_equal(x.grad.data, np.ones(3))


def test_backward_order_is_topological():
    log = []
    x = Tensor(np.arange(3.0), requires_grad=True)
    a = Probe("a", log)(x)
    b = Probe("b", log)(a * 2.0)
    c = Probe("c", log)(a + b)
    d = Probe("d", log)(c * b)
    e = Probe("e", log)(d + a)
    e.sum().backward()
    assert sorted(log) == ["a", "b", "c", "d", "e"], "each Function runs exactly once"
    consumers = {"a": "bce", "b": "cd", "c": "d", "d": "e"}  # who reads each probe's output
    for producer, readers in consumers.items():
        for reader in readers:
            assert log.index(reader) < log.index(producer), f"{producer} ran before its consumer {reader}: {log}"


def test_no_grad_records_nothing():
    x = Tensor(np.ones(3), requires_grad=True)
    with no_grad():
        assert not is_grad_enabled()
        y = ops.relu(x * 2.0 + x)
    assert is_grad_enabled()
    assert y.creator is None and not y.requires_grad
    y.sum().backward()
    assert x.grad is None


def test_no_grad_restores_state_after_exception_and_nests():
    with pytest.raises(RuntimeError):
        with no_grad():
            raise RuntimeError
    assert is_grad_enabled()
    with no_grad():
        with no_grad():
            pass
        assert not is_grad_enabled()
    assert is_grad_enabled()


def test_inputs_without_requires_grad_get_no_gradient():
    x, w = Tensor(np.ones(3)), Tensor(np.full(3, 2.0), requires_grad=True)
    (x * w).sum().backward()
    assert x.grad is None
    np.testing.assert_array_equal(w.grad.data, np.ones(3))


def test_preallocated_leaf_grad_is_accumulated_in_place():
    flat = np.zeros(10)
    flat[2:8] = 0.25
    x0 = rng(44).standard_normal((2, 3))
    x = Tensor(x0.copy(), requires_grad=True)
    x.grad = Tensor(flat[2:8].reshape(2, 3))  # a view, as the optimizer's flat buffer makes it
    grad_array = x.grad.data
    (x * x + x * 3.0).sum().backward()        # two contributions, both into the view
    assert x.grad.data is grad_array
    np.testing.assert_allclose(flat[2:8].reshape(2, 3), 0.25 + 2 * x0 + 3, rtol=1e-14)
    assert flat[0] == flat[1] == flat[8] == flat[9] == 0


def test_leaf_grads_accumulate_across_backward_calls():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    (x * 3.0).sum().backward()
    first = x.grad.data
    (x * x).sum().backward()
    assert x.grad.data is first
    np.testing.assert_allclose(x.grad.data, [3 + 2, 3 + 4])


def test_leaves_sharing_an_upstream_gradient_get_their_own_copies():
    """Add hands the same array to both inputs; a leaf must not alias it (or the other leaf)."""
    a, b = Tensor(np.zeros(3), requires_grad=True), Tensor(np.zeros(3), requires_grad=True)
    (a + b).backward(np.array([1.0, 2.0, 3.0]))
    assert not np.shares_memory(a.grad.data, b.grad.data)
    a.grad.data += 10
    np.testing.assert_array_equal(b.grad.data, [1.0, 2.0, 3.0])


def test_explicit_upstream_gradient():
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    (x * x).backward(Tensor(np.array([1.0, 0.5, -1.0])))
    np.testing.assert_allclose(x.grad.data, [2.0, 2.0, -6.0])


def test_intermediate_grads_are_released():
    x = Tensor(np.ones((2, 2)), requires_grad=True)
    a = x * 2.0
    b = ops.relu(a)
    c = b * b + a
    loss = c.sum()
    loss.backward()
    assert a.grad is None and b.grad is None and c.grad is None
    np.testing.assert_allclose(x.grad.data, np.full((2, 2), (2 * 2.0 + 1) * 2))  # dc/da = 2b + 1, b = a = 2


def test_activations_are_freed_during_backward():
    """When the backward of stage i runs, every activation above stage i is already gone:
    its consumers and its creator have run and released what they kept."""
    depth, log, seen_alive = 4, [], {}
    r = rng(45)
    x = Tensor(r.standard_normal((2, 8)), requires_grad=True)
    weights = [Tensor(r.standard_normal((8, 8)), requires_grad=True) for _ in range(depth)]
    refs = {}  # stage -> weakrefs to the arrays of that stage's activations

    def check(stage):
        def hook():
            seen_alive[stage] = [j for j, arrays in refs.items() if j > stage and any(ref() is not None for ref in arrays)]
        return hook

    def build():  # the activations live only inside the graph once build() returns
        h = x
        for i in range(depth):
            p = Probe(i, log, check(i))(h)
            z = ops.linear(p, weights[i])
            h = ops.relu(z)
            refs[i] = [weakref.ref(p.data), weakref.ref(z.data), weakref.ref(h.data)]
        return h.sum()

    loss = build()
    assert all(ref() is not None for arrays in refs.values() for ref in arrays), "the graph keeps activations"
    loss.backward()
    assert log == list(reversed(range(depth)))
    assert seen_alive == {i: [] for i in range(depth)}, f"activations still alive at each stage: {seen_alive}"
    assert all(ref() is None for arrays in refs.values() for ref in arrays)
    assert all(w.grad is not None for w in weights)


def test_function_returning_none_for_an_input():
    class ScaleBy(Function):  # gradient only for the first input
        def forward(self, x, s):
            self.s = s
            return x * s

        def backward(self, gy):
            return gy * self.s, None

    x, s = Tensor(np.ones(2), requires_grad=True), Tensor(np.array(3.0), requires_grad=True)
    ScaleBy()(x, s).sum().backward()
    np.testing.assert_array_equal(x.grad.data, [3.0, 3.0])
    assert s.grad is None


def test_scalars_and_arrays_mix_with_tensors():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = np.array([10.0, 20.0]) * x + 1 - x * 2
    assert isinstance(y, Tensor)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.data, [8.0, 18.0])
    assert (-x).data.tolist() == [-1.0, -2.0]
    assert Tensor(np.ones((2, 3))).mean().item() == 1.0
