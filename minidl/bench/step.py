"""`python -m minidl.bench step`: one full training step (forward, loss, backward, optimizer)
of minidl against the same step in PyTorch, measured in the same run.

Same model, batch, input size and threads; the steps alternate, and the medians after warm-up
are compared as img/s, then each framework's peak memory in a fresh subprocess. On GPU
PyTorch runs eager with cuDNN, channels_last and bf16 autocast; minidl in fp32 unless --amp,
and --cuda-graph replays its step. --profile splits minidl's time per operation; --trace
measures what --trace-steps tracing costs.

Details: docs/training.md, "minidl/bench/step.py".
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

OPENBLAS_TUNING = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
UNSET_NOTE = "MINIDL_BENCH_UNSET"  # tells the restarted process what it unset
NUM_CLASSES = 1000


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m minidl.bench step", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet20")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--vs-torch", action="store_true", help="measure PyTorch too and print the ratio")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--profile", action="store_true", help="print minidl's time per operation")
    p.add_argument("--trace", action="store_true", help="time minidl's step with tracing on too")
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=False,
                   help="minidl's batch norms fused into the convolutions (train.py's --fuse)")
    p.add_argument("--amp", action="store_true", help="minidl in bf16 (GPU only)")
    p.add_argument("--cuda-graph", action="store_true", help="replay minidl's step from a CUDA graph (GPU only)")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="JSON instead of a table: a line with the step times first, then one with the peak "
                        "memory too (measured after, in subprocesses); with FILE, written there at each of "
                        "the two moments (a run cut short keeps the times)")
    p.add_argument("--memory-of", choices=("minidl", "torch"), help=argparse.SUPPRESS)  # the subprocess mode
    return p.parse_args(argv)


def synchronize(device):
    if device == "gpu":
        import cupy
        cupy.cuda.Device().synchronize()


def minidl_step(args):
    """A closure running one minidl training step on a fixed random batch."""
    import numpy
    from minidl import Tensor, ops
    from minidl.backend import xp
    from minidl.bench.profile import saved_bytes
    from minidl.models import MODELS
    from minidl.optim import SGD
    model = MODELS[args.model](num_classes=NUM_CLASSES, fuse=args.fuse)
    optimizer = SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    rng = numpy.random.default_rng(0)
    if args.amp or args.cuda_graph:
        return minidl_device_step(args, model, optimizer, rng)
    x = Tensor(xp.asarray(rng.standard_normal((args.batch_size, args.image_size, args.image_size, 3),
                                              dtype=numpy.float32)))
    labels = xp.asarray(rng.integers(0, NUM_CLASSES, args.batch_size))

    def forward():
        return ops.softmax_cross_entropy(model(x), labels)

    def step():
        optimizer.zero_grad()
        forward().backward()
        optimizer.step()
        synchronize(args.device)
    step.model = model
    step.saved_bytes = lambda: saved_bytes(forward(), model.parameters())
    return step


def traced(step):
    """`step` with the trace recorder running: its hooks set, its intervals read back and dropped."""
    from minidl.training.recorder import TraceRecorder
    from minidl.training.timer import StepTimer
    recorder = TraceRecorder(step.model, StepTimer(synchronize=lambda: None))

    def traced_step():
        recorder.start()
        step()
        recorder.stop()
        recorder.collect()
    return traced_step


def minidl_device_step(args, model, optimizer, rng):
    """--amp / --cuda-graph: minidl.training.device_step's step on a fixed uint8 batch, replayed from a
    CUDA graph with --cuda-graph. The closure's `pools`: the memory pools its step draws from."""
    import cupy
    import numpy
    from minidl.training.device_step import DeviceStep
    from minidl.training.graph import GraphedStep
    images = cupy.asarray(rng.integers(0, 256, (args.batch_size, args.image_size, args.image_size, 3),
                                       dtype=numpy.uint8))
    labels = cupy.asarray(rng.integers(0, NUM_CLASSES, args.batch_size))
    device_step = DeviceStep(model, optimizer, amp=args.amp)
    graphed = GraphedStep(device_step, optimizer, images.shape) if args.cuda_graph else None

    def step():
        (graphed or device_step)(images, labels)
        synchronize(args.device)
    step.pools = [cupy.get_default_memory_pool()] + ([graphed.cuda.pool] if graphed else [])
    step.model = model
    return step


def torch_step(args, threads):
    import torch
    from minidl.bench.torch_resnet import torch_resnet
    torch.set_num_threads(threads)
    device = "cuda" if args.device == "gpu" else "cpu"
    torch.backends.cudnn.benchmark = True
    model = torch_resnet(args.model, NUM_CLASSES).to(device)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    if args.device == "gpu":
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    labels = torch.randint(0, NUM_CLASSES, (args.batch_size,), device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    autocast = args.device == "gpu"  # PyTorch's fast GPU path: bf16 autocast

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            loss = torch.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
    return step


def timed(step):
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def measure(steps, warmup, iters):
    """Median seconds per step of each closure, the closures taking turns."""
    for step in steps:
        for _ in range(warmup):
            step()
    times = [[] for _ in steps]
    for _ in range(iters):
        for step, bucket in zip(steps, times):
            bucket.append(timed(step))
    return [statistics.median(bucket) for bucket in times]


def peak_memory_mb(args, framework):
    """Run a few steps of one framework in a fresh process; its peak memory in MB."""
    command = [sys.executable, "-m", "minidl.bench", "step", "--model", args.model, "--batch-size",
               str(args.batch_size), "--image-size", str(args.image_size), "--device", args.device,
               "--memory-of", framework] + ["--amp"] * args.amp + ["--cuda-graph"] * args.cuda_graph + \
        ["--fuse"] * args.fuse
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def report_own_memory(args):
    """The subprocess side of peak_memory_mb: print this process's peak for 3 steps."""
    threads = thread_count(args)  # imports minidl (and NumPy) before the baseline
    if args.memory_of == "torch":
        import torch  # noqa: F401  (the library's own footprint is not the step's)
    baseline_kb = memory_kb("VmRSS")
    step = minidl_step(args) if args.memory_of == "minidl" else torch_step(args, threads)
    for _ in range(3):
        step()
    if args.device == "gpu":
        print(gpu_pool_mb(args.memory_of, step))
    else:  # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent at fork
        print((memory_kb("VmHWM") - baseline_kb) / 1024)


def memory_kb(field):
    """This process's resident memory (VmRSS) or its peak since exec (VmHWM), in KiB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(f"{field}:"))


def gpu_pool_mb(framework, step):
    """PyTorch's peak reservation, or the size of the pools minidl's `step` draws from (each
    keeps its high-water mark)."""
    if framework == "torch":
        import torch
        return torch.cuda.max_memory_reserved() / 2**20
    import cupy
    return sum(pool.total_bytes() for pool in getattr(step, "pools", [cupy.get_default_memory_pool()])) / 2**20


def thread_count(args):
    from minidl import parallel
    return parallel.num_threads if args.device == "cpu" else 1


def main(argv):
    args = parse_args(argv)
    unset = [name for name in OPENBLAS_TUNING if name in os.environ]
    if unset:  # OpenBLAS reads them once, when it loads: start again without them
        env = {k: v for k, v in os.environ.items() if k not in OPENBLAS_TUNING}
        env[UNSET_NOTE] = ",".join(unset)
        os.execve(sys.executable, [sys.executable, "-m", "minidl.bench", "step", *argv], env)
    os.environ["MINIDL_DEVICE"] = args.device
    if args.memory_of:
        report_own_memory(args)
        return 0
    from minidl.backend import require_gpu
    from minidl.errors import UserError
    from minidl.models import MODELS
    if args.model not in MODELS:
        raise UserError(f"unknown model {args.model!r}: choose one of {', '.join(MODELS)}")
    for flag, wanted in (("--amp", args.amp), ("--cuda-graph", args.cuda_graph)):
        if wanted:
            require_gpu(flag)
    for flag, wanted in (("--profile", args.profile), ("--trace", args.trace)):
        if wanted and args.cuda_graph:
            raise UserError(f"{flag} times each operation from Python, which a replayed CUDA graph does not run: "
                            f"drop {flag} or --cuda-graph")
    threads = thread_count(args)
    steps = [minidl_step(args)] + ([torch_step(args, threads)] if args.vs_torch else [])
    steps += [traced(steps[0])] if args.trace else []
    seconds = measure(steps, args.warmup, args.iters)
    result = {"model": args.model, "batch_size": args.batch_size, "image_size": args.image_size,
              "device": args.device, "amp": args.amp, "cuda_graph": args.cuda_graph, "fuse": args.fuse,
              "threads": threads,
              "minidl_step_ms": 1e3 * seconds[0], "minidl_img_per_s": args.batch_size / seconds[0]}
    from minidl import environment
    if environment.value(UNSET_NOTE):
        result["unset_env"] = environment.value(UNSET_NOTE)
    if args.trace:
        result.update(traced_step_ms=1e3 * seconds[-1], traced_img_per_s=args.batch_size / seconds[-1],
                      trace_overhead=seconds[-1] / seconds[0] - 1)
    if args.vs_torch:
        result.update(torch_step_ms=1e3 * seconds[1], torch_img_per_s=args.batch_size / seconds[1],
                      ratio=seconds[1] / seconds[0])  # minidl's img/s over PyTorch's
    write_json(args.json, result)  # the times first: the memory subprocesses take as long again
    result["minidl_peak_mb"] = peak_memory_mb(args, "minidl")
    if args.vs_torch:
        result["torch_peak_mb"] = peak_memory_mb(args, "torch")
        result["memory_ratio"] = result["minidl_peak_mb"] / result["torch_peak_mb"]
    write_json(args.json, result)
    if not args.json:
        print_table(result)
    if args.profile:
        from minidl.bench.profile import print_profile
        print_profile(steps[0], args.iters)
        if hasattr(steps[0], "saved_bytes"):
            print(f"saved for backward: {steps[0].saved_bytes() / args.batch_size / 1024:.0f} KiB per image "
                  "(the parameters not counted)")
    return 0


def write_json(destination, result):
    """The result as a JSON line on stdout ("-"), or written to the file `destination` (None: neither)."""
    if destination == "-":
        print(json.dumps(result), flush=True)
    elif destination is not None:
        from minidl.fileio import write_json_atomic
        write_json_atomic(destination, result)


def print_table(result):
    flags = "".join(f", {name}" for name in ("amp", "cuda_graph", "fuse") if result[name])
    print(f"{result['model']}, batch {result['batch_size']}, {result['image_size']}x{result['image_size']}, "
          f"{result['device']}{flags}, {result['threads']} threads")
    if "unset_env" in result:
        print(f"(unset for this benchmark: {', '.join(result['unset_env'])})")
    print(f"{'':8}{'img/s':>10}{'step ms':>10}{'peak MB':>10}")
    for name in ("minidl", "torch") if "torch_img_per_s" in result else ("minidl",):
        print(f"{name:8}{result[name + '_img_per_s']:>10.1f}{result[name + '_step_ms']:>10.1f}"
              f"{result[name + '_peak_mb']:>10.0f}")
    if "traced_step_ms" in result:
        print(f"{'traced':8}{result['traced_img_per_s']:>10.1f}{result['traced_step_ms']:>10.1f}")
        print(f"tracing on: {100 * result['trace_overhead']:+.1f}% step time (minidl's step alternating with and "
              "without the recorder)")
    if "ratio" in result:
        print(f"minidl/torch: {result['ratio']:.2f}x img/s, {result['memory_ratio']:.2f}x peak memory")
