"""The pieces a plan is built from: the model's costs against a torch twin's shapes, the order of
its backward against minidl's autograd, the recording communicator's groups against hand-made
layouts, and the stages and buckets it records against the cost model and the reducer's cut."""
import numpy
import pytest
import torch

from minidl import Tensor, distributed, models, nn, ops
from minidl.bench.torch_resnet import TORCH_TWINS
from minidl.distributed import costmodel
from minidl.distributed.reducer import MEGABYTE
from minidl.plan import stages
from minidl.plan.profile import profile


def torch_flops(name, image_size, num_classes):
    """2 x multiply-adds of every convolution and linear layer of the torch twin, from the output
    shapes of a real forward pass (torch's own shape arithmetic)."""
    twin, total = TORCH_TWINS[name](num_classes), []

    def count(module, inputs, output):
        if isinstance(module, torch.nn.Conv2d):
            k, c, r, s = module.weight.shape
            total.append(2 * output.shape[2] * output.shape[3] * k * c * r * s)
        elif isinstance(module, torch.nn.Linear):
            total.append(2 * module.weight.numel())

    for module in twin.modules():
        module.register_forward_hook(count)
    with torch.no_grad():
        twin(torch.zeros(1, 3, image_size, image_size))
    return sum(total)


@pytest.mark.parametrize("name, image_size, num_classes", [("resnet50", 224, 1000), ("resnet20", 32, 10),
                                                          ("resnet18", 160, 1000)])
def test_convolution_and_classifier_flops_match_the_torch_twins_shapes(name, image_size, num_classes):
    p = profile(name, image_size, num_classes)
    mine = sum(layer.forward_flops for layer in p.layers if not layer.name.split(".")[-1].startswith("bn")
               and not layer.name.endswith("downsample.1"))
    assert mine == torch_flops(name, image_size, num_classes)
    # backward: weight and input gradients, except the stem's input (an image needs none)
    stem = next(layer for layer in p.layers if layer.name == "conv1")
    assert stem.backward_flops == stem.forward_flops
    assert all(layer.backward_flops >= layer.forward_flops for layer in p.layers)


def test_every_parameter_belongs_to_one_layer():
    p = profile("resnet50", 224)
    owned = sorted(i for layer in p.layers for i in layer.parameters)
    assert owned == list(range(len(p.parameter_names))) and p.num_parameters == 25_557_032


def test_gradients_become_final_in_the_order_minidls_autograd_delivers_them():
    """A real backward through resnet20 (a tiny image): the order in which parameters receive their
    gradients is the order of the profile's final moments (ties: the same moment)."""
    nn.manual_seed(0)
    model = models.resnet20(num_classes=10)
    params = model.parameters()
    delivered = []
    index = {id(p): i for i, p in enumerate(params)}
    for p in params:
        p.grad_hook = lambda tensor, p=p: delivered.append(index[id(p)])
    try:
        x = numpy.random.default_rng(0).standard_normal((2, 8, 8, 3)).astype(numpy.float32)
        ops.softmax_cross_entropy(model(Tensor(x)), numpy.array([1, 2])).backward()
    finally:
        for p in params:
            p.grad_hook = None
    fractions = profile("resnet20", 8, 10).final_fractions()
    assert sorted(delivered) == list(range(len(params)))
    moments = [fractions[i] for i in delivered]
    assert moments == sorted(moments), "a parameter became final before one the profile finishes earlier"


def world(size, per_node):
    return stages.RecordingComm(numpy.arange(size), per_node)


def test_the_recording_comm_splits_as_mpi_would():
    comm = world(8, 4)
    rows = comm.split(comm.rank // 4, comm.rank % 4)  # AllReduce's torus rows of X = 4
    columns = comm.split(comm.rank % 4, comm.rank // 4)
    assert rows.ranks.tolist() == [0, 1, 2, 3] and rows.per_node == 4
    assert columns.ranks.tolist() == [0, 4] and columns.per_node == 1
    assert comm.node_comm.ranks.tolist() == [0, 1, 2, 3] and comm.cross_node_comm.ranks.tolist() == [0, 4]
    reordered = comm.split(0, -comm.rank)  # one group, ordered by key
    assert reordered.ranks.tolist() == [7, 6, 5, 4, 3, 2, 1, 0]
    with pytest.raises(ValueError, match="groups of one size"):
        comm.split(comm.rank < 3, 0)


@pytest.mark.parametrize("algorithm, shape, expected", [
    ("ring", None, [("world", "allreduce", 16, 4, 1.0)]),
    ("hierarchical", None, [("node", "reduce_scatter", 4, 4, 1.0), ("nodes", "allreduce", 4, 1, 0.25),
                            ("node", "allgather", 4, 4, 1.0)]),
    ("torus2d", (8, 2), [("row", "reduce_scatter", 8, 4, 1.0), ("column", "allreduce", 2, 1, 0.125),
                         ("row", "allgather", 8, 4, 1.0)]),
    ("torus2d", (2, 8), [("row", "reduce_scatter", 2, 2, 1.0), ("column", "allreduce", 8, 2, 0.5),
                         ("row", "allgather", 2, 2, 1.0)]),
])
def test_allreduce_plans_its_stages_on_the_recording_comm(algorithm, shape, expected):
    """16 ranks on nodes of 4: the groups, their sizes, ranks per node and bytes (hand-made layouts)."""
    allreduce = distributed.AllReduce(world(16, 4), algorithm, shape)
    buffer = numpy.zeros(4096, numpy.float32)
    got = [(s.group, s.op, s.comm.size, s.comm.per_node, s.nbytes / buffer.nbytes)
           for s in allreduce.plan(buffer).stages]
    assert got == expected


def test_a_stage_costs_what_the_cost_model_says_of_its_ring():
    links = costmodel.Machine(gpus_per_node=4, alpha=1e-5, intra_bandwidth=1e9, node_bandwidth=2e9,
                              intra_alpha=2e-6)
    inside = stages.Stage("row", "reduce_scatter", 4, 4, 4_000_000)
    across = stages.Stage("column", "allreduce", 8, 1, 1_000_000)
    assert inside.seconds(links) == pytest.approx(3 * (2e-6 + 1e6 / 1e9))  # NVLink, intra latency
    assert across.seconds(links) == pytest.approx(14 * (1e-5 + 125_000 / (2e9 / 4)))  # 4 rings share the node


def test_the_exchange_cuts_the_real_flat_buffer_as_the_reducer_does():
    model = profile("resnet50", 224).model
    exchange = stages.exchange(model, 64, 4, "torus2d", (8, 8), 25)
    sizes = [(b.stop - b.start) for b in exchange.buckets]
    assert sum(sizes) == exchange.flat_elements >= model.num_parameters()
    assert exchange.flat_elements % 1024 == 0 and exchange.flat_elements - model.num_parameters() < 1024
    assert sizes[1:] == [25 * MEGABYTE // 4] * (len(sizes) - 1)  # launched from the end: the remainder first
    assert exchange.buckets[0].stop == exchange.flat_elements and exchange.buckets[-1].start == 0
    assert exchange.buckets[-1].parameters[0] == 0  # conv1.weight, the last gradient backward delivers
    assert exchange.algorithm == "torus2d 8x8"
