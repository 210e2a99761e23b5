"""Under mpiexec -n N: the gradient reducer on real models, data-parallel SGD, BN statistics.

- overlap: reducing during backward (GradientReducer.backward) gives the same bits as
  reducing after it, with buckets launched before backward returned, on ResNet-20 and on a
  model that uses one layer twice; both equal the sum of every rank's local gradient;
- equivalence: N ranks × batch b reach the parameters of 1 rank × batch N·b after several
  SGD steps with momentum and weight decay (float64, no batch norm);
- batch norm: parameters and buffers start from rank 0's (broadcast_state), running
  statistics afterwards are each rank's own batch's, parameters stay identical on all ranks.
"""
import math

import numpy as np
from common import Checks, TiedNet

from minidl import distributed, models, nn, ops
from minidl.autograd import Tensor
from minidl.optim import SGD

comm = distributed.init()
checks = Checks(comm)
rank, size = comm.rank, comm.size


class SmallNet(nn.Module):
    """[BN →] conv → relu → pool → linear."""

    def __init__(self, batch_norm=False):
        super().__init__()
        self.bn = nn.BatchNorm2d(3) if batch_norm else None
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        if self.bn is not None:
            x = self.bn(x)
        return self.fc(ops.global_avg_pool(ops.relu(self.conv(x))))


def loss_of(model, x, labels):
    return ops.softmax_cross_entropy(model(Tensor(x)), labels)


def identical_everywhere(array, what):
    first = np.array(array, copy=True)
    comm.bcast(first)
    checks.equal(array, first, f"{what}: every rank holds rank 0's bits")


def check_overlap(allreduce, build, label, bucket_mb):
    nn.manual_seed(1)
    model = build()
    optimizer = SGD(model.parameters(), lr=0.1)
    reducer = distributed.GradientReducer(allreduce, optimizer.flat, bucket_mb)
    data = np.random.default_rng(10 + rank)
    x, labels = data.standard_normal((2, 8, 8, 3)).astype(np.float32), data.integers(0, 5, 2)
    results = {}
    for overlap in (False, True, False):  # plain, overlapped, plain again (the reducer is reusable)
        optimizer.zero_grad()
        loss = loss_of(model, x, labels)
        reducer.backward(loss) if overlap else loss.backward()
        local = optimizer.flat.grad.copy()
        reducer.wait()
        results.setdefault(overlap, []).append(optimizer.flat.grad.copy())
        if overlap:
            checks.true(size == 1 or reducer.launched_in_backward == len(reducer.plans) > 1,
                        f"{label}: {reducer.launched_in_backward} of {len(reducer.plans)} buckets started in backward")
    plain, overlapped = results[False][0], results[True][0]
    checks.equal(overlapped, plain, f"{label}: overlapped = plain, bit for bit")
    checks.equal(results[False][1], plain, f"{label}: a second plain reduction repeats the first")
    expected = np.sum(comm.allgather_object(local), axis=0, dtype=np.float64)
    checks.close(plain, expected, f"{label}: the sum of every rank's gradient", rtol=1e-5,
                 atol=1e-6 * np.abs(expected).max())
    whole = local.copy()
    allreduce(whole)  # one all-reduce of the whole buffer
    if size <= 2:  # x0 + x1 is the same bits in any grouping
        checks.equal(plain, whole, f"{label}: bucketed = whole buffer, bit for bit")
    identical_everywhere(plain, label)


def check_equivalence(allreduce, label, steps=3, batch=2):
    data = np.random.default_rng(5)
    xs = data.standard_normal((steps, size * batch, 6, 6, 3))
    ys = data.integers(0, 5, (steps, size * batch))

    def build(grad_scale, align):
        nn.manual_seed(3)
        model = SmallNet().astype(np.float64)
        return model, SGD(model.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-3,
                          grad_scale=grad_scale, align=align)

    model, optimizer = build(1 / size, math.lcm(1024, allreduce.alignment))
    reducer = distributed.GradientReducer(allreduce, optimizer.flat, bucket_mb=0.0005)
    single, single_optimizer = build(1.0, 1024)
    mine = slice(rank * batch, (rank + 1) * batch)
    for step in range(steps):
        optimizer.zero_grad()
        reducer.backward(loss_of(model, xs[step, mine], ys[step, mine]))
        reducer.wait()
        optimizer.step()
        single_optimizer.zero_grad()
        loss_of(single, xs[step], ys[step]).backward()
        single_optimizer.step()
    used = optimizer.flat.size
    checks.close(optimizer.flat.data[:used], single_optimizer.flat.data[:used],
                 f"{label}: {size} ranks × batch {batch} = 1 rank × batch {size * batch}", rtol=1e-10,
                 atol=1e-13)
    checks.true(not np.array_equal(optimizer.flat.data[:used], build(1, 1024)[1].flat.data[:used]),
                f"{label}: the parameters moved")
    identical_everywhere(optimizer.flat.data, f"{label} parameters")


def check_batch_norm(allreduce):
    nn.manual_seed(100 + rank)  # a different initialization on every rank ...
    model = SmallNet(batch_norm=True)
    model.bn.running_mean[...] = rank
    distributed.broadcast_state(comm, model.state_dict().values())  # ... until rank 0's is broadcast
    for name, array in model.state_dict().items():
        identical_everywhere(array, f"broadcast {name}")
    checks.equal(model.bn.running_mean, np.zeros(3), "broadcast running_mean is rank 0's zeros")
    optimizer = SGD(model.parameters(), lr=0.1, grad_scale=1 / size)
    reducer = distributed.GradientReducer(allreduce, optimizer.flat)
    x = np.random.default_rng(rank).standard_normal((4, 5, 5, 3)).astype(np.float32) + rank
    optimizer.zero_grad()
    reducer.backward(loss_of(model, x, np.arange(4) % 5))
    reducer.wait()
    optimizer.step()
    checks.close(model.bn.running_mean, 0.1 * x.mean(axis=(0, 1, 2)), "running mean of my batch", rtol=1e-5)
    checks.close(model.bn.running_var, 0.9 + 0.1 * x.var(axis=(0, 1, 2), ddof=1), "running var of my batch", rtol=1e-5)
    means = comm.allgather_object(model.bn.running_mean.copy())
    checks.true(len({m.tobytes() for m in means}) == size, "every rank keeps different statistics")
    identical_everywhere(optimizer.flat.data, "parameters after a step with batch norm")


x_side = distributed.square_grid(size)[0]
configurations = [("ring", comm, None), ("torus2d", comm, None), ("torus2d", comm, (size, 1)),
                  ("hierarchical", distributed.Communicator(ranks_per_node=x_side), None)]
for algorithm, group, shape in configurations:
    allreduce = distributed.AllReduce(group, algorithm, shape)
    label = repr(allreduce) + (f" with {x_side} ranks per node" if algorithm == "hierarchical" else "")
    check_overlap(allreduce, lambda: models.resnet20(num_classes=5), f"resnet20 {label}", bucket_mb=0.1)
    check_overlap(allreduce, TiedNet, f"tied layer {label}", bucket_mb=0.0002)
    check_equivalence(allreduce, label)
check_batch_norm(distributed.AllReduce(comm, "torus2d"))
checks.finish()
