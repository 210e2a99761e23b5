"""The gradient reducer's bookkeeping, in one process, with a communicator that records.

`TwinComm` poses as two ranks that hold the same data: a collective's result is twice what
the buffer held WHEN IT WAS STARTED. A bucket launched before its gradients were final would
therefore come out different from twice the final local gradient, deterministically.
"""
import numpy as np
import pytest

from minidl import distributed, nn, ops
from minidl.autograd import Function, Tensor
from minidl.distributed.reducer import bucket_bounds, count_uses
from minidl.optim import SGD
from mpi.common import TiedNet


class TwinRequest:
    def __init__(self, buffer):
        self.buffer, self.snapshot = buffer, buffer.copy()

    def test(self):
        return True

    def wait(self):
        if self.snapshot is not None:
            self.buffer[...] = 2 * self.snapshot
            self.snapshot = None


class TwinComm:
    size, rank = 2, 0

    def __init__(self, flat):
        self.flat, self.pending, self.launches = flat, [], []

    def dup(self):
        return self

    def start(self, op, src, dst, root=0):
        assert op == "allreduce" and src is dst
        self.launches.append(self.flat.grad.copy())  # the whole buffer at this moment
        self.pending.append(TwinRequest(dst))
        return self.pending[-1]


def reducer_for(model, bucket_mb):
    optimizer = SGD(model.parameters(), lr=0.1, align=8)
    comm = TwinComm(optimizer.flat)
    return optimizer, comm, distributed.GradientReducer(distributed.AllReduce(comm, "ring"), optimizer.flat, bucket_mb)


def loss_of(model):
    x = np.random.default_rng(0).standard_normal((2, 5, 5, 3)).astype(np.float32)
    return ops.softmax_cross_entropy(model(Tensor(x)), np.array([0, 2]))


@pytest.mark.parametrize("bucket_mb", [None, 0.00005, 0.0002])
def test_buckets_launch_during_backward_with_final_gradients(bucket_mb):
    nn.manual_seed(0)
    model = TiedNet()
    optimizer, comm, reducer = reducer_for(model, bucket_mb)
    optimizer.zero_grad()
    loss_of(model).backward()
    local = optimizer.flat.grad.copy()

    optimizer.zero_grad()
    reducer.backward(loss_of(model))
    buckets = len(reducer.plans)
    assert reducer.launched_in_backward == buckets == len(comm.launches)
    reducer.wait()
    np.testing.assert_array_equal(optimizer.flat.grad, 2 * local)
    if buckets > 1:  # the head's bucket left while the first layer had no gradient yet
        conv_size = model.conv.weight.size
        assert not comm.launches[0][:conv_size].any() and local[:conv_size].any()


def test_plain_backward_reduces_every_bucket_in_wait():
    nn.manual_seed(0)
    model = TiedNet()
    optimizer, comm, reducer = reducer_for(model, 0.0001)
    optimizer.zero_grad()
    loss_of(model).backward()
    local = optimizer.flat.grad.copy()
    assert not comm.launches
    reducer.wait()
    assert len(comm.launches) == len(reducer.plans) > 1
    np.testing.assert_array_equal(optimizer.flat.grad, 2 * local)


def test_a_missing_wait_is_an_error():
    nn.manual_seed(0)
    model = TiedNet()
    optimizer, _, reducer = reducer_for(model, None)
    reducer.backward(loss_of(model))
    with pytest.raises(RuntimeError, match="call wait"):
        reducer.backward(loss_of(model))


class NoGradForSecond(Function):
    def forward(self, a, b):
        return a * 1.0

    def backward(self, gy):
        return gy, None


def test_a_gradient_that_never_comes_still_gets_its_bucket_reduced():
    first, second = nn.Parameter(np.ones(3, np.float32)), nn.Parameter(np.ones(3, np.float32))
    optimizer = SGD([second, first], lr=0.1, align=1)
    comm = TwinComm(optimizer.flat)
    three_floats = 12 / (1 << 20)
    reducer = distributed.GradientReducer(distributed.AllReduce(comm, "ring"), optimizer.flat, bucket_mb=three_floats)
    assert count_uses(NoGradForSecond()(first, second).sum(), {id(second): 0, id(first): 1}) == {0: 1, 1: 1}
    optimizer.zero_grad()
    second.grad.data[...] = 5  # stays as it is: backward delivers nothing to `second`
    reducer.backward(NoGradForSecond()(first, second).sum())
    assert reducer.launched_in_backward == 1  # `first`'s bucket; `second`'s waits for the end
    reducer.wait()
    np.testing.assert_array_equal(optimizer.flat.grad, [10, 10, 10, 2, 2, 2])


def test_count_uses_counts_every_input_slot():
    w, v = nn.Parameter(np.ones(2)), nn.Parameter(np.ones(2))
    x = Tensor(np.arange(2.0))
    loss = ((w * x + w) * w + x).sum()
    assert count_uses(loss, {id(w): 0, id(v): 1}) == {0: 3}
    assert count_uses(w, {id(w): 0}) == {0: 1}


def test_bucket_bounds_cover_the_buffer_from_its_end():
    assert bucket_bounds(10, 4, None, 2) == [(0, 10)]
    # 16 bytes / 4-byte items = 4 elements, rounded down to the alignment 3
    assert bucket_bounds(10, 4, 16 / (1 << 20), 3) == [(9, 10), (6, 9), (3, 6), (0, 3)]
    assert bucket_bounds(10, 4, 1e-9, 4) == [(8, 10), (4, 8), (0, 4)]


def test_hooks_tell_when_each_bucket_is_final_and_when_its_stages_run():
    nn.manual_seed(0)
    model = TiedNet()
    optimizer, _, reducer = reducer_for(model, 0.0002)
    log = []
    reducer.on_final = lambda k: log.append(("final", k))
    for k, plan in enumerate(reducer.plans):
        plan.on_stage = lambda index, moment, k=k: log.append((moment, k, index))
    buckets = len(reducer.plans)
    assert buckets > 1
    for overlapped in (True, False):
        log.clear()
        optimizer.zero_grad()
        reducer.backward(loss_of(model)) if overlapped else loss_of(model).backward()
        during_backward = len(log)
        reducer.wait()
        for k in range(buckets):  # one ring stage per bucket
            assert [entry for entry in log if entry[1] == k] == \
                [("final", k), ("start", k, 0), ("issued", k, 0), ("done", k, 0)]
        assert [entry[1] for entry in log if entry[0] == "start"] == list(range(buckets))  # launch order
        assert (during_backward > 0) == overlapped  # a plain backward leaves everything to wait()
