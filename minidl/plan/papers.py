"""The simulator against what the papers published: `python -m minidl.plan.papers` prints the
table of docs/plan.md. Each published figure is simulated on the paper's machine file with
minidl's pieces doing what the paper's system did, then again with each input of the machine 20%
lower and 20% higher; the input that moves the simulated figure most is named. Nothing is fitted.

Goyal et al. 2017 (arXiv:1706.02677): §4, §5.5, Fig. 7-8 and the abstract. Mikami et al. 2018
(arXiv:1811.05233): v1 (224 s, 91.62%) and v2 (122 s).

Details: docs/plan.md, "Against the papers".
"""
import dataclasses
import sys

from minidl.config import Config
from minidl.distributed import costmodel
from minidl.plan import machines, run
from minidl.plan.profile import profile
from minidl.training.build import schedule_rows

IMAGENET = 1_281_167
FACTOR = 0.2  # each input varied by ±20%
INPUTS = {  # the machine's inputs: how to scale each by a factor
    "intra-node bandwidth": lambda m, f: dataclasses.replace(m, intra_node_bandwidth=m.intra_node_bandwidth * f),
    "intra-node latency": lambda m, f: dataclasses.replace(m, intra_node_latency=m.intra_node_latency * f),
    "network bandwidth": lambda m, f: dataclasses.replace(m, network_adapter_bandwidth=m.network_adapter_bandwidth * f),
    "network latency": lambda m, f: dataclasses.replace(m, network_latency=m.network_latency * f),
    "GPU compute speed": lambda m, f: dataclasses.replace(m, compute=faster(m.compute, f)),
    "GPU memory bandwidth": lambda m, f: dataclasses.replace(m, memory_bandwidth=m.memory_bandwidth * f),
}


def faster(compute, factor):
    """`compute` `factor` times as fast."""
    if compute.images_per_second:
        return dataclasses.replace(compute, images_per_second=compute.images_per_second * factor)
    return dataclasses.replace(compute, backward_ms=compute.backward_ms / factor,
                               forward_ms=compute.forward_ms and compute.forward_ms / factor)


@dataclasses.dataclass(frozen=True)
class Check:
    paper: str
    published: str  # the figure as the paper states it
    value: float  # the same as a number, in `unit`
    unit: str
    machine: str
    how: str  # what minidl simulates for it
    simulate: object  # machine -> the simulated value in `unit`


def whole_run(machine, world_size, algorithm, **settings):
    """The Run of minidl's `algorithm` for a configuration of `settings` (Config fields) on `world_size` GPUs."""
    config = Config(**settings).resolved(imagenet=True)
    setup = run.Setup(config.model, config.train_crop_size, machine, world_size, config.bucket_mb)
    (result,) = run.simulate_run(setup, schedule_rows(config, world_size, IMAGENET), (algorithm,))
    return result


def iteration_seconds(machine, world_size, algorithm, per_gpu_batch):
    result = whole_run(machine, world_size, algorithm, batch_size=per_gpu_batch, epochs=1)
    return result.iterations[(per_gpu_batch, 1)].seconds


def halving_doubling_speedup(machine):
    """Goyal et al.'s between-server all-reduce on 32 servers, one participant per server, each of
    ResNet-50's parameters reduced on its own (as Caffe2 did): the ring's time over halving-doubling's."""
    servers = dataclasses.replace(machine.links(), gpus_per_node=1)
    sizes = [4 * p.size for p in profile("resnet50", 224).model.parameters()]
    ring = sum(costmodel.seconds(costmodel.ring(servers, 32, n), servers) for n in sizes)
    halving = sum(costmodel.seconds(costmodel.halving_doubling(servers, 32, n), servers) for n in sizes)
    return ring / halving


GOYAL = "Goyal et al. 2017"
MIKAMI = "Mikami et al. 2018"
CHECKS = (
    Check(GOYAL, "time per iteration grows only ~12% from 8 to 352 GPUs (§5.5, Fig. 7)", 1.12, "x", "big_basin",
          "hierarchical, 32 images per GPU: iteration on 352 GPUs / on 8",
          lambda m: iteration_seconds(m, 352, "hierarchical", 32) / iteration_seconds(m, 8, "hierarchical", 32)),
    Check(GOYAL, "an epoch takes over 16 minutes on 8 GPUs (§5.5, Fig. 7)", 16, "min", "big_basin",
          "hierarchical, 32 images per GPU, 8 GPUs",
          lambda m: whole_run(m, 8, "hierarchical", batch_size=32, epochs=1).seconds / 60),
    Check(GOYAL, "an epoch takes about 30 s on 352 GPUs (§5.5, Fig. 7)", 30, "s", "big_basin",
          "hierarchical, 32 images per GPU, 352 GPUs",
          lambda m: whole_run(m, 352, "hierarchical", batch_size=32, epochs=1).seconds),
    Check(GOYAL, "~90% scaling efficiency from 8 to 256 GPUs (§5.5, Fig. 8)", 0.90, "", "big_basin",
          "hierarchical, 32 images per GPU: iteration on 8 GPUs / on 256",
          lambda m: iteration_seconds(m, 8, "hierarchical", 32) / iteration_seconds(m, 256, "hierarchical", 32)),
    Check(GOYAL, "ResNet-50, 90 epochs in about one hour on 256 GPUs at 8k (abstract)", 60, "min", "big_basin",
          "--recipe goyal, hierarchical, 256 GPUs",
          lambda m: whole_run(m, 256, "hierarchical", recipe="goyal").seconds / 60),
    Check(GOYAL, "halving/doubling 3x faster than the ring on 32 servers (§4)", 3.0, "x", "big_basin",
          "the cost model's ring over halving-doubling, 32 servers, each ResNet-50 parameter on its own",
          halving_doubling_speedup),
    Check(MIKAMI, "91.62% GPU scaling efficiency on 1,088 V100", 0.9162, "", "abci",
          "torus2d on the chooser's grid, 32 images per GPU, against the same GPUs without communication",
          lambda m: whole_run(m, 1088, "torus2d", model="resnet50", batch_size=32, epochs=1).efficiency),
    Check(MIKAMI, "224 s on 2,176 V100, batch 34K to 68K (v1)", 224, "s", "abci",
          "--recipe sony, torus2d on the chooser's grid, 2,176 GPUs",
          lambda m: whole_run(m, 2176, "torus2d", recipe="sony").seconds),
    Check(MIKAMI, "122 s on 3,456 V100 (v2)", 122, "s", "abci",
          "--recipe sony122, torus2d on the chooser's grid, 3,456 GPUs",
          lambda m: whole_run(m, 3456, "torus2d", recipe="sony122").seconds),
)


def evaluate(check):
    """(simulated value, relative error, [(input, value at -20%, value at +20%)] most moving first)."""
    machine = machines.load(check.machine)
    simulated = check.simulate(machine)
    moved = []
    for name, scale in INPUTS.items():
        low, high = (check.simulate(scale(machine, 1 + sign * FACTOR)) for sign in (-1, 1))
        moved.append((name, low, high))
    moved.sort(key=lambda item: -max(abs(item[1] - simulated), abs(item[2] - simulated)))
    return simulated, (simulated - check.value) / check.value, moved


def number(value, unit):
    if unit == "":
        return f"{value:.1%}"
    return f"{value:.3g} {unit}".strip()


def table(checks=CHECKS):
    lines = ["| paper | published | machine | simulated (what minidl runs) | error | most sensitive input: "
             "its -20% / +20% |", "|---|---|---|---|---|---|"]
    for check in checks:
        simulated, error, moved = evaluate(check)
        name, low, high = moved[0]
        lines.append(f"| {check.paper} | {check.published} | {check.machine} | {number(simulated, check.unit)} "
                     f"({check.how}) | {error:+.0%} | {name}: {number(low, check.unit)} / {number(high, check.unit)} |")
    return "\n".join(lines)


def main():
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
