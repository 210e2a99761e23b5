"""`mpiexec -n N python -m minidl.bench allreduce`: the all-reduce algorithms against MPI's own.

Each algorithm is checked against the closed-form sum, then timed per buffer size (median of
`--repeat` calls, the slowest rank's time) and reported as time, algorithm and bus bandwidth,
and its ratio to MPI's native all-reduce. `--model` prints the alpha–beta cost model's
predictions and grid choices for ResNet-50 on the Sony runs' GPU counts, without MPI.

Details: docs/distributed.md, "minidl/bench/allreduce.py".
"""
import argparse
import json
import statistics
import time

import numpy

from minidl import distributed
from minidl.distributed import costmodel, grid
from minidl.distributed.allreduce import on_grid
from minidl.errors import UserError
from minidl.fileio import writable

MB = 1 << 20


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m minidl.bench allreduce", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", default="1,2,5,10,20,50,100", help="buffer sizes in MiB (comma-separated)")
    parser.add_argument("--algorithms", default="ring,hierarchical,torus2d", help="comma-separated")
    parser.add_argument("--torus-shape", default=None, help="XxY for torus2d(-p2p) (default: the squarest)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--repeat", type=int, default=10, help="timed calls per algorithm and size")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--model", action="store_true", help="print the cost model's predictions instead")
    parser.add_argument("--calibrate", default=None, help="with --model: a --json file to fit the model to")
    parser.add_argument("--bytes", type=float, default=costmodel.RESNET50_GRADIENT_BYTES,
                        help="with --model: the gradient's size (default: ResNet-50 in fp32)")
    args = parser.parse_args(argv)
    if args.json:  # before measuring, not after
        writable("--json", args.json)
    return args


def main(argv):
    args = parse_args(argv)
    if args.model:
        return print_model(args)
    comm = distributed.init()
    results = measure(comm, args)
    if comm.rank == 0:
        print_table(results)
        if args.json:
            with open(args.json, "w") as file:
                json.dump(results, file, indent=1)
    return 0


def measure(comm, args):
    shape = distributed.parse_shape(args.torus_shape) if args.torus_shape else None
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    reducers = {"native": comm.allreduce}  # MPI_Allreduce, what `ring` calls
    for name in algorithms:
        allreduce = distributed.AllReduce(comm, name, shape if on_grid(name) else None)
        reducers[allreduce.name] = allreduce
    dtype = numpy.dtype(args.dtype)
    rows = []
    for megabytes in parse_sizes(args.sizes_mb):
        buffer = numpy.empty(int(megabytes * MB) // dtype.itemsize, dtype)
        for name, reduce in reducers.items():
            validate(comm, reduce, buffer, name)
        seconds = timed(comm, reducers, buffer, args.repeat)
        for name in reducers:
            rows.append({"algorithm": name, "bytes": buffer.nbytes, "ranks": comm.size, "seconds": seconds[name],
                         "algbw": buffer.nbytes / seconds[name],
                         "busbw": buffer.nbytes / seconds[name] * 2 * (comm.size - 1) / comm.size,
                         "vs_native": seconds["native"] / seconds[name], "local_size": comm.local_size})
    return rows


def parse_sizes(text):
    try:
        sizes = [float(s) for s in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) <= 0:
        raise UserError(f"--sizes-mb {text!r} is not a list of positive sizes: write e.g. 1,10,100")
    return sizes


def validate(comm, reduce, buffer, name):
    buffer.fill(comm.rank + 1)
    reduce(buffer)
    expected = comm.size * (comm.size + 1) / 2
    if not (buffer == expected).all():
        raise UserError(f"the {name} all-reduce gave a wrong sum on rank {comm.rank}: a bug, please report it")


def timed(comm, reducers, buffer, repeat):
    """{name: median over `repeat` calls of the slowest rank's time}. The algorithms take turns
    call by call, so a machine whose load changes meanwhile affects them alike."""
    times = {name: [] for name in reducers}
    for _ in range(repeat + 1):  # the first round warms up
        for name, reduce in reducers.items():
            comm.barrier()
            start = time.perf_counter()
            reduce(buffer)
            times[name].append(max(comm.allgather_object(time.perf_counter() - start)))
    return {name: statistics.median(values[1:]) for name, values in times.items()}


def print_table(rows):
    print(f"all-reduce on {rows[0]['ranks']} ranks ({rows[0]['local_size']} per node), median of the slowest rank")
    print(f"{'size':>8}  {'algorithm':<14} {'time ms':>9} {'algbw GB/s':>11} {'busbw GB/s':>11} {'vs native':>10}")
    for row in rows:
        print(f"{row['bytes'] / MB:>5g}MiB  {row['algorithm']:<14} {row['seconds'] * 1e3:>9.2f} "
              f"{row['algbw'] / 1e9:>11.2f} {row['busbw'] / 1e9:>11.2f} {row['vs_native']:>9.2f}x")


def print_model(args):
    nbytes = args.bytes
    if args.calibrate:
        print_calibration(args.calibrate)
    machine = costmodel.ABCI
    print(f"\npredicted all-reduce of {nbytes / 1e6:.1f} MB (ResNet-50's fp32 gradient by default) on ABCI-like "
          f"nodes: {machine.gpus_per_node} GPUs, NVLink {machine.intra_bandwidth / 1e9:.0f} GB/s, "
          f"network {machine.node_bandwidth / 1e9:.0f} GB/s per node, α = {machine.alpha * 1e6:.0f} µs")
    print(f"{'GPUs':>6}  {'algorithm':<22} {'steps':>6} {'MB sent/rank':>13} {'time ms':>9}")
    for ranks in (1088, 2176, 3456):
        grids = costmodel.sony_grids(ranks, machine.gpus_per_node)
        for label, phases in costmodel.candidates(machine, ranks, nbytes, grids):
            print(f"{ranks:>6}  {label:<22} {costmodel.steps(phases):>6} {costmodel.bytes_sent(phases) / 1e6:>13.1f} "
                  f"{costmodel.seconds(phases, machine) * 1e3:>9.2f}")
        print("        latency steps: ring 2(XY−1) = " f"{2 * (ranks - 1)}, torus 2(X−1)+2(Y−1) = "
              + ", ".join(f"{2 * (x - 1) + 2 * (y - 1)} ({x}x{y})" for x, y in grids))
        for bucket_mb in (25, 0):
            choice = grid.predict(ranks, machine.gpus_per_node, grid.bucket_sizes(nbytes, bucket_mb))
            (x, y), seconds = choice.predicted["chosen"]
            print(f"        a run's default grid, {f'{bucket_mb} MiB buckets' if bucket_mb else 'one bucket'}: "
                  f"{x}x{y} {seconds * 1e3:.2f} ms")
    print("hierarchical = the torus with one node per row; halving-doubling counts the fold of the ranks "
          "beyond a power of two (2 steps of the whole buffer)")
    return 0


def read_results(path):
    """The rows of a --json file of this benchmark, and the machine the cost model fits to its native rows."""
    try:
        with open(path) as file:
            rows = json.load(file)
        ranks = rows[0]["ranks"]
        native = [(r["bytes"], r["seconds"]) for r in rows if r["algorithm"] == "native"]
    except (OSError, ValueError, TypeError, KeyError, IndexError) as error:
        raise UserError(f"cannot read benchmark results from {path} ({type(error).__name__}: {error}): pass a file "
                        "written by `python -m minidl.bench allreduce --json`")
    if len(native) < 2:
        raise UserError(f"{path} holds {len(native)} sizes of the native all-reduce; the fit needs two or more: "
                        "run the benchmark with several --sizes-mb")
    return rows, costmodel.calibrate(native, ranks)


def print_calibration(path):
    rows, machine = read_results(path)
    ranks = rows[0]["ranks"]
    print(f"calibrated on {path}: {ranks} ranks on one node, α = {machine.alpha * 1e6:.1f} µs, "
          f"link bandwidth {machine.intra_bandwidth / 1e9:.2f} GB/s")
    print(f"{'size':>8}  {'algorithm':<14} {'measured ms':>12} {'model ms':>9}")
    for row in rows:
        phases = model_of(row["algorithm"], machine, ranks, row["local_size"], row["bytes"])
        print(f"{row['bytes'] / MB:>5g}MiB  {row['algorithm']:<14} {row['seconds'] * 1e3:>12.2f} "
              f"{costmodel.seconds(phases, machine) * 1e3:>9.2f}")


def model_of(algorithm, machine, ranks, local_size, nbytes):
    """The modelled phases of a benchmark row's algorithm ('native', or an AllReduce.name such as
    'torus2d 2x4')."""
    name, _, grid_text = algorithm.partition(" ")
    shape = tuple(int(v) for v in grid_text.split("x")) if grid_text else None
    return costmodel.of_algorithm("ring" if name == "native" else name, machine, ranks, nbytes, shape, local_size)
