"""Machines as data: one JSON file per machine (`machines/NAME.json`), a source beside every figure.

A file gives the GPUs per node, the link between two GPUs of a node (bandwidth per direction,
latency per message), the network (adapters per node, each adapter's bandwidth, latency per
message), the GPU's memory bandwidth (the update's pass over the flat buffers) and one measured
compute figure: a training throughput, or a backward (and forward) time, at the batch it was
measured at. `load` validates a file: a figure that is missing, not a number, zero or negative,
or given without its source is one line naming the file, the field and the fix.

Details: docs/plan.md, "Machines".
"""
import dataclasses
import json
import math
from pathlib import Path

from minidl.distributed import costmodel
from minidl.errors import UserError
from minidl.models import MODELS

FOLDER = Path(__file__).parent / "machines"
GIGA = 1e9
MICRO = 1e-6
# field: (unit factor to SI, whether it counts things). Every one is a {"value": v, "source": "..."}.
FIGURES = {
    "gpus_per_node": (1, True),
    "intra_node_bandwidth_GBps": (GIGA, False),  # bytes/s from a GPU to another GPU of its node, one direction
    "intra_node_latency_us": (MICRO, False),
    "network_adapters_per_node": (1, True),
    "network_adapter_Gbps": (GIGA / 8, False),  # bits/s of one adapter, one direction
    "network_latency_us": (MICRO, False),
    "memory_bandwidth_GBps": (GIGA, False),
}
COMPUTE_RATES = ("images_per_second", "backward_ms")  # one of them, at "batch" images per GPU


@dataclasses.dataclass(frozen=True)
class Compute:
    """One GPU's speed on `model` at `image_size`: `images_per_second` of whole training
    iterations, or `backward_ms` (and optionally `forward_ms`) of one iteration, at `batch` images."""
    model: str
    image_size: int
    batch: int
    source: str
    images_per_second: float | None = None
    forward_ms: float | None = None
    backward_ms: float | None = None


@dataclasses.dataclass(frozen=True)
class Machine:
    name: str
    about: str
    gpus_per_node: int
    intra_node_bandwidth: float  # bytes/s
    intra_node_latency: float  # s
    network_adapters_per_node: int
    network_adapter_bandwidth: float  # bytes/s
    network_latency: float  # s
    memory_bandwidth: float  # bytes/s
    compute: Compute
    sources: dict  # field of the file -> where its figure comes from

    @property
    def node_bandwidth(self):
        return self.network_adapters_per_node * self.network_adapter_bandwidth

    def links(self):
        """The cost model's description of this machine's links."""
        return costmodel.Machine(gpus_per_node=self.gpus_per_node, alpha=self.network_latency,
                                 intra_bandwidth=self.intra_node_bandwidth, node_bandwidth=self.node_bandwidth,
                                 intra_alpha=self.intra_node_latency)


def names():
    """The machines shipped with minidl."""
    return sorted(path.stem for path in FOLDER.glob("*.json"))


def load(name_or_path):
    """The Machine of a shipped machine's name, or of a JSON file's path."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        path = FOLDER / f"{name_or_path}.json"
        if not path.exists():
            raise UserError(f"unknown machine {name_or_path!r}: choose one of {', '.join(names())}, "
                            "or give the path of a machine file (NAME.json)")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UserError(f"cannot read the machine file {path} ({error}): give a JSON file like those in {FOLDER}")
    if not isinstance(data, dict):
        raise UserError(f"machine file {path} is not a JSON object: write it like those in {FOLDER}")
    return parse(data, path)


def parse(data, path):
    figures = {field: figure(data, field, path, counts) * unit for field, (unit, counts) in FIGURES.items()}
    compute = parse_compute(data.get("compute"), path)
    return Machine(name=str(data.get("name") or path.stem), about=str(data.get("about", "")),
                   gpus_per_node=int(figures["gpus_per_node"]),
                   intra_node_bandwidth=figures["intra_node_bandwidth_GBps"],
                   intra_node_latency=figures["intra_node_latency_us"],
                   network_adapters_per_node=int(figures["network_adapters_per_node"]),
                   network_adapter_bandwidth=figures["network_adapter_Gbps"],
                   network_latency=figures["network_latency_us"],
                   memory_bandwidth=figures["memory_bandwidth_GBps"], compute=compute,
                   sources={**{field: data[field]["source"] for field in FIGURES}, "compute": compute.source})


def figure(data, field, path, counts=False):
    """data[field]["value"], checked: present, a positive number (an integer where it counts things), sourced."""
    entry = data.get(field)
    example = f'"{field}": {{"value": ..., "source": "where the figure comes from"}}'
    if not isinstance(entry, dict) or "value" not in entry:
        raise UserError(f"machine file {path} has no {field}: add {example}")
    value = entry["value"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UserError(f"machine file {path}: {field} is {value!r}, not a positive number: give the measured "
                        f"or published figure, as {example}")
    if counts and value != int(value):
        raise UserError(f"machine file {path}: {field} is {value!r}: it counts things, give a whole number")
    source = entry.get("source")
    if not isinstance(source, str) or not source.strip():
        raise UserError(f"machine file {path}: {field} has no source: add \"source\": \"where the figure comes "
                        "from\" beside its value")
    return value


def parse_compute(entry, path):
    example = ('"compute": {"model": "resnet50", "image_size": 224, "batch": 256, "images_per_second": ..., '
               '"source": "..."}')
    if not isinstance(entry, dict):
        raise UserError(f"machine file {path} has no compute figure: add {example}")
    rates = [rate for rate in COMPUTE_RATES if rate in entry]
    if len(rates) != 1:
        raise UserError(f"machine file {path}: compute needs exactly one of {' or '.join(COMPUTE_RATES)}, "
                        f"not {', '.join(rates) or 'none'}: write it as {example}")
    for key in ("batch", "image_size"):
        if key not in entry:
            raise UserError(f"machine file {path}: compute has no {key}: write it as {example}")
    keys = ["batch", "image_size", *rates, *(["forward_ms"] if "forward_ms" in entry else [])]
    sourced = {key: {"value": entry[key], "source": entry.get("source")} for key in keys}  # one source for all
    numbers = {key: figure(sourced, key, path, counts=key in ("batch", "image_size")) for key in keys}
    if entry.get("model") not in MODELS:
        raise UserError(f"machine file {path}: compute's model {entry.get('model')!r} is not one of "
                        f"{', '.join(MODELS)}: name the model its figure was measured on")
    return Compute(model=entry["model"], image_size=int(numbers.pop("image_size")), batch=int(numbers.pop("batch")),
                   source=entry["source"], **numbers)


def calibrated(machine, links, source):
    """`machine` on one node whose links are those of `links`, a costmodel.Machine fitted to a
    benchmark (`costmodel.calibrate`): every message costs its alpha, every rank its bandwidth."""
    figures = {field: source for field in FIGURES if field != "memory_bandwidth_GBps"}
    return dataclasses.replace(machine, name=f"{machine.name}, links calibrated", gpus_per_node=links.gpus_per_node,
                               intra_node_bandwidth=links.intra_bandwidth, intra_node_latency=links.alpha,
                               network_adapters_per_node=1, network_adapter_bandwidth=links.node_bandwidth,
                               network_latency=links.alpha, sources={**machine.sources, **figures})
