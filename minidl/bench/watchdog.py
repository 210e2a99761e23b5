"""`mpiexec -n N python -m minidl.bench watchdog`: what the watchdog's heartbeat costs rank 0.

Every rank runs simulated steps for `--seconds`: five activities of equal length (data, forward,
backward, bucket 0, update) that sleep, and in bucket 0 a small all-reduce, its wait under the
armed deadline, as in training. Rank 0 reports the watchdog's messages it received per second,
the CPU time of its heartbeat thread per second, and the CPU time of its whole process per
second beside the same loop run right after with the watchdog off; then the time and messages
of one survey of every rank, as a stalled wait makes (the others wait in a barrier meanwhile).

Details: docs/distributed.md, "The watchdog at scale".
"""
import argparse
import json
import os
import resource
import socket
import time

import numpy

from minidl import distributed
from minidl.distributed import watchdog
from minidl.fileio import writable

ACTIVITIES = ("data", "forward", "backward", "bucket 0", "update")


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m minidl.bench watchdog", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long each loop runs")
    parser.add_argument("--step-ms", type=float, default=100.0, help="a simulated step's length")
    parser.add_argument("--json", default=None, help="also append the result as one JSON line to this file")
    args = parser.parse_args(argv)
    if args.json:
        writable("--json", args.json)
    return args


def main(argv):
    args = parse_args(argv)
    comm = distributed.init()
    ranks = comm.allgather_object({"rank": comm.rank, "host": socket.gethostname(), "pid": os.getpid()})
    watchdog.arm(comm, 600, 60, ranks)
    armed = run_steps(comm, args)
    messages, thread_seconds = watchdog.load()
    survey = time_survey(comm)
    survey["messages"] = watchdog.load()[0] - messages
    watchdog.disarm()
    unarmed = run_steps(comm, args)
    if comm.rank == 0:
        result = {"ranks": comm.size, "seconds": armed["seconds"], "steps": armed["steps"],
                  "messages_per_s": messages / armed["seconds"], "thread_cpu_per_s": thread_seconds / armed["seconds"],
                  "process_cpu_per_s": armed["cpu"] / armed["seconds"],
                  "process_cpu_per_s_off": unarmed["cpu"] / unarmed["seconds"], "survey_seconds": survey["seconds"],
                  "survey_messages": survey["messages"], "nodes": survey["nodes"], "load": os.getloadavg()[0]}
        print(f"watchdog on {comm.size} ranks, {result['steps']} steps of {args.step_ms:g} ms in "
              f"{result['seconds']:.1f} s: rank 0 received {result['messages_per_s']:.1f} watchdog messages/s, "
              f"its heartbeat thread used {result['thread_cpu_per_s'] * 1e3:.2f} ms of CPU/s, the process "
              f"{result['process_cpu_per_s'] * 1e3:.1f} ms/s ({result['process_cpu_per_s_off'] * 1e3:.1f} ms/s "
              f"with the watchdog off); a survey of all ranks on {result['nodes']} node(s) took "
              f"{result['survey_seconds'] * 1e3:.1f} ms and {result['survey_messages']} messages in; "
              f"load average {result['load']:.1f}")
        if args.json:
            with open(args.json, "a") as file:
                file.write(json.dumps(result) + "\n")
    return 0


def run_steps(comm, args):
    """The simulated steps for `args.seconds`: {steps, seconds, cpu (rank's user + system seconds)}."""
    total, lap = numpy.zeros(1), args.step_ms / 1e3 / len(ACTIVITIES)
    comm.barrier()
    start, cpu, steps = time.monotonic(), cpu_seconds(), 0
    while comm.sum([time.monotonic() - start < args.seconds])[0] == comm.size:  # every rank goes on
        steps += 1
        watchdog.at_step(steps)
        for activity in ACTIVITIES:
            watchdog.doing(activity)
            if activity == "bucket 0":
                comm.allreduce(total)
            time.sleep(lap)
    return {"steps": steps, "seconds": time.monotonic() - start, "cpu": cpu_seconds() - cpu}


def time_survey(comm):
    """On rank 0: {seconds, nodes} of one survey of every rank; the others wait for it in a barrier."""
    result = {}
    if comm.rank == 0:
        start = time.perf_counter()
        seen = watchdog.survey()
        result = {"seconds": time.perf_counter() - start, "nodes": comm.num_nodes}
        if len(seen) != comm.size:
            raise RuntimeError(f"the survey saw {len(seen)} of {comm.size} ranks")
    comm.barrier()
    return result


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
