"""A whole training run, simulated: each epoch's batch layout from the engine's schedule, one
simulated iteration per distinct layout, times the iterations of every epoch that has it.

The same run is simulated with each all-reduce algorithm side by side: the ring, the
hierarchical one and the 2D torus on the grid the engine's chooser takes (or the one given).
A GPU's compute comes from the machine's figure, scaled to the planned model and image size by
FLOPs and linearly in the batch; the update streams the flat buffers once through the GPU's
memory.

Details: docs/plan.md, "The run".
"""
import dataclasses
import functools

from minidl.distributed import grid
from minidl.errors import UserError
from minidl.plan import iteration, stages
from minidl.plan.profile import profile

UPDATE_ARRAYS = 6  # SGD's pass: reads weights, gradient, velocity and decay rates; writes weights and velocity
ALGORITHMS = ("ring", "hierarchical", "torus2d")


@dataclasses.dataclass(frozen=True)
class Setup:
    """What is planned: a model on `world_size` GPUs of `machine`, the gradient in `bucket_mb` buckets."""
    model: str
    image_size: int
    machine: object  # machines.Machine
    world_size: int
    bucket_mb: float
    torus_shape: tuple = None  # None: the engine's choice
    update_seconds: float = None  # None: from the machine's memory bandwidth
    loader_images_per_second: float = None  # per GPU; None: data is never waited for

    @property
    def gpus_per_node(self):
        return min(self.machine.gpus_per_node, self.world_size)

    @property
    def nodes(self):
        return -(-self.world_size // self.machine.gpus_per_node)

    def check(self):
        g = self.machine.gpus_per_node
        if self.world_size < 1:
            raise UserError(f"--world-size must be a positive number of GPUs, got {self.world_size}")
        if self.world_size > g and self.world_size % g:
            raise UserError(f"{self.world_size} GPUs do not fill whole nodes of {g} on {self.machine.name}: "
                            f"use a multiple of {g} (e.g. {self.world_size // g * g or g} or "
                            f"{(self.world_size // g + 1) * g})")
        if self.torus_shape is not None:
            x, y = grid.check_shape(self.torus_shape, self.world_size)
            aligned = grid.aligned_grids(self.world_size, self.gpus_per_node)
            if (x, y) not in aligned:
                raise UserError(f"torus shape {x}x{y} does not line up with nodes of {self.gpus_per_node} GPUs, "
                                "which is what the simulation models: use one of "
                                f"{', '.join(f'{a}x{b}' for a, b in aligned)}")
        return self


@dataclasses.dataclass(frozen=True)
class Algorithm:
    label: str  # "ring", "hierarchical", "torus2d 64x34"
    exchange: stages.Exchange
    grid: object = None  # the torus's grid.GridChoice


@dataclasses.dataclass(frozen=True)
class EpochTime:
    epoch: int
    global_batch: int
    per_gpu_batch: int
    accum_steps: int
    iterations: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class Run:
    algorithm: Algorithm
    iterations: dict  # (per-GPU batch, accumulation steps) -> iteration.Iteration
    epochs: tuple  # EpochTime of every epoch

    @property
    def seconds(self):
        return sum(epoch.seconds for epoch in self.epochs)

    @property
    def images(self):
        return sum(epoch.iterations * epoch.global_batch for epoch in self.epochs)

    @property
    def compute_only_seconds(self):
        return sum(e.iterations * self.iterations[(e.per_gpu_batch, e.accum_steps)].compute_only for e in self.epochs)

    @property
    def efficiency(self):
        """Against the same GPUs without communication."""
        return self.compute_only_seconds / self.seconds if self.seconds else 1.0


def per_image_seconds(setup):
    """(forward, backward) seconds per image of one GPU on the planned model: the machine's figure,
    scaled by the FLOPs of the planned model over those of the figure's model at its image size."""
    compute = setup.machine.compute
    measured, planned = profile(compute.model, compute.image_size), profile(setup.model, setup.image_size)
    share = measured.forward_flops / (measured.forward_flops + measured.backward_flops)
    if compute.images_per_second:
        forward, backward = share / compute.images_per_second, (1 - share) / compute.images_per_second
    else:
        backward = compute.backward_ms / 1e3 / compute.batch
        forward = compute.forward_ms / 1e3 / compute.batch if compute.forward_ms else \
            backward * measured.forward_flops / measured.backward_flops
    return (forward * planned.forward_flops / measured.forward_flops,
            backward * planned.backward_flops / measured.backward_flops)


def update_seconds(setup, exchange):
    if setup.update_seconds is not None:
        return setup.update_seconds
    return UPDATE_ARRAYS * 4 * exchange.flat_elements / setup.machine.memory_bandwidth


def algorithms(setup, names=ALGORITHMS):
    """Algorithm of each name (the torus on the chooser's grid for this layout, or setup.torus_shape)."""
    model = profile(setup.model, setup.image_size).model
    chosen = []
    for name in names:
        choice, shape = None, None
        if name == "torus2d":
            buckets = grid.bucket_sizes(4 * model.num_parameters(), setup.bucket_mb)  # as the trainer asks
            choice = grid.predict(setup.world_size, setup.gpus_per_node, buckets, setup.torus_shape,
                                  setup.machine.links())
            shape = choice.shape
        exchange = cached_exchange(setup.model, setup.image_size, setup.world_size, setup.machine.gpus_per_node,
                                   name, shape, setup.bucket_mb)
        chosen.append(Algorithm(exchange.algorithm, exchange, choice))
    return chosen


@functools.lru_cache(maxsize=64)
def cached_exchange(model, image_size, world_size, gpus_per_node, algorithm, shape, bucket_mb):
    return stages.exchange(profile(model, image_size).model, world_size, gpus_per_node, algorithm, shape, bucket_mb)


def simulate_iteration(setup, algorithm, per_gpu_batch, accum):
    """One Iteration at `per_gpu_batch` images per GPU in `accum` micro-batches."""
    forward, backward = per_image_seconds(setup)
    micro = per_gpu_batch // accum
    links = setup.machine.links()
    buckets = algorithm.exchange.buckets
    seconds = [[stage.seconds(links) for stage in bucket.stages] for bucket in buckets]
    data = per_gpu_batch / setup.loader_images_per_second if setup.loader_images_per_second else 0.0
    return iteration.simulate(micro * forward, micro * backward, update_seconds(setup, algorithm.exchange), accum,
                              profile(setup.model, setup.image_size).final_fractions(), buckets, seconds, data)


def simulate_run(setup, epoch_rows, names=ALGORITHMS):
    """A Run per algorithm over the epochs of `epoch_rows` (minidl.schedule.epoch_table's rows)."""
    runs = []
    for algorithm in algorithms(setup.check(), names):
        layouts = {(row["per_rank_batch"], row["accum_steps"]) for row in epoch_rows}
        simulated = {layout: simulate_iteration(setup, algorithm, *layout) for layout in sorted(layouts)}
        epochs = tuple(EpochTime(row["epoch"], row["global_batch"], row["per_rank_batch"], row["accum_steps"],
                                 row["iterations"],
                                 row["iterations"] * simulated[(row["per_rank_batch"], row["accum_steps"])].seconds)
                       for row in epoch_rows)
        runs.append(Run(algorithm, simulated, epochs))
    return runs


def scales(setup):
    """The GPU counts of a scaling curve up to setup.world_size: one GPU, one node, then doubling nodes."""
    g, counts = setup.machine.gpus_per_node, {1, setup.world_size}
    count = g
    while count < setup.world_size:
        counts.add(count)
        count *= 2
    return sorted(counts)


def efficiency_curve(setup, per_gpu_batch, accum, names=ALGORITHMS):
    """{algorithm name: [(GPUs, scaling efficiency of one iteration at per_gpu_batch)]} at every scale."""
    curve = {name: [] for name in names}
    for gpus in scales(setup):
        at = dataclasses.replace(setup, world_size=gpus, torus_shape=None).check()
        for name, algorithm in zip(names, algorithms(at, names)):
            it = simulate_iteration(at, algorithm, per_gpu_batch, accum)
            curve[name].append((gpus, it.compute_only / it.seconds))
    return curve
