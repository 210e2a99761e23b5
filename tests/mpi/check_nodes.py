"""Under mpiexec on several hosts (tests/mpi/hosts.py), PER_HOST ranks on each: what the job finds
of its nodes, against the host names the ranks see (the fixture gave every host its own).

    check_nodes.py PER_HOST TUNER_CACHE

- the node grouping: every rank's node is its host, found (MINIDL_RANKS_PER_NODE unset);
- hierarchical: the first and last stage run among the ranks of one host, the middle one among
  one rank of each host;
- torus2d: the default grid has one host's ranks in a row;
- the kernel tuner's agreement: the validation runs once per host (its lowest rank), a kernel
  failing on the last host is refused on every host, rank 0 alone times and decides. The
  validation is faked as in check_tuner_agreement.py; TUNER_CACHE is a path in each host's
  private /tmp, so each host keeps its own cache of its own validation;
- no shared memory crosses a host: ranks of two hosts share no IPC or mount namespace and map
  no common /dev/shm file, each maps its own host's /dev/shm only, and the ranks of one host
  do share one (MPI's intra-node transport).
"""
import itertools
import json
import os
import socket
import sys

import numpy as np
from common import Checks

from minidl import distributed
from minidl.distributed.launch import load_mpi
from minidl.kernels import canary, conv
from minidl.kernels.autotune import Autotuner, Plan
from minidl.training.build import RankAgreement

per_host, cache = int(sys.argv[1]), sys.argv[2]
world = distributed.init()
checks = Checks(world)
hosts = world.allgather_object(socket.gethostname())
mine = [r for r, host in enumerate(hosts) if host == hosts[world.rank]]
local = [hosts[:r].count(host) for r, host in enumerate(hosts)]  # each rank's index among its host's ranks


def members(comm):
    """The world ranks of a sub-communicator, in its order."""
    return comm.allgather_object(world.rank) if comm is not None else [world.rank]


# --- the nodes --------------------------------------------------------------------------------
order = list(dict.fromkeys(hosts))
checks.true(len(mine) == per_host and len(order) == world.size // per_host, f"hosts {hosts}")
checks.true(load_mpi().Get_processor_name() == hosts[world.rank], "MPI names the host as the fixture did")
checks.true((world.local_rank, world.local_size, world.node, world.num_nodes) ==
            (mine.index(world.rank), per_host, order.index(hosts[world.rank]), len(order)),
            f"rank {world.rank}: local rank {world.local_rank} of {world.local_size}, node {world.node} of "
            f"{world.num_nodes}, on {hosts[world.rank]}")

# --- hierarchical and torus2d on the real nodes --------------------------------------------------
hierarchical = distributed.AllReduce(world, "hierarchical")
checks.equal(members(hierarchical.inner), mine, "hierarchical: the node stage is this host's ranks")
checks.equal(members(hierarchical.outer), [r for r in range(world.size) if local[r] == local[world.rank]],
             "hierarchical: the nodes stage is one rank of each host, with this rank's local index")
choice = distributed.choose_grid(world, [1.09e6])
checks.true(choice.shape == (per_host, len(order)) and choice.ranks_per_node == per_host, f"default grid {choice}")
torus = distributed.AllReduce(world, "torus2d", choice.shape)
checks.equal(members(torus.inner), mine, "torus2d: a row is one host's ranks")

# --- the tuner's agreement: once per node ---------------------------------------------------------
V2, FAILING_V2 = Plan("v2", "bf16_256x128"), Plan("v2", "bf16_128x128")  # the failing one would be fastest
FAILING = FAILING_V2.kernel_name("conv_fwd")
validations, timed = [], []
later_is_faster = itertools.count(100.0, -1.0)


def validate(known, record):
    validations.append(world.rank)
    for plan in canary.PLANS:
        failing = plan.name == FAILING and world.node == world.num_nodes - 1
        record(plan.name, {"status": "failed" if failing else "ok", "error": "injected" if failing else None,
                           "max_error": None, "seconds": 0.0})


def timer(function):
    timed.append(world.rank)
    function()
    return next(later_is_faster)


tuner = Autotuner(timer, cache_path=os.path.join(cache, "tuner.json"), validate=validate,
                  agreement=RankAgreement(world))
plans = [Plan("v1", next(iter(conv.TILES))), V2, FAILING_V2]
chosen = tuner.choose("conv_fwd key", lambda: plans, lambda plan: np.ones(3, np.float32), "conv_fwd")
leaders = [r for r in range(world.size) if local[r] == 0]
checks.equal(sorted(sum(world.allgather_object(validations), [])), leaders, "one validation per host")
checks.true(FAILING in tuner.validation["failed"], f"rank {world.rank} knows the last host's failure")
checks.true(chosen == V2 and world.allgather_object(chosen.label()) == [chosen.label()] * world.size,
            f"rank 0's choice everywhere, not the plan failed on another host: {chosen}")
checks.equal(sorted(sum(world.allgather_object(timed), [])), [0, 0], "rank 0 alone timed the two usable plans")
world.barrier()
with open(os.path.join(cache, "tuner.json")) as file:  # this host's, written by its leader
    status = json.load(file)["plans"][FAILING]["status"]
checks.true((status == "failed") == (world.node == world.num_nodes - 1), f"{hosts[world.rank]}'s cache: {status}")

# --- no shared memory across hosts ----------------------------------------------------------------
distributed.AllReduce(world, "ring")(np.ones(1 << 18))  # large and small messages have flowed everywhere
shm_device = os.stat("/dev/shm").st_dev
mapped = set()
with open("/proc/self/maps") as maps:
    for line in maps:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
            major, minor = (int(part, 16) for part in fields[3].split(":"))
            mapped.add((os.makedev(major, minor), int(fields[4]), fields[5].strip()))
namespaces = (os.readlink("/proc/self/ns/ipc"), os.readlink("/proc/self/ns/mnt"))
everyone = world.allgather_object((hosts[world.rank], namespaces, sorted(mapped)))
checks.true(all(device == shm_device for device, _, _ in mapped), f"rank {world.rank} maps another host's /dev/shm")
for rank, (host, spaces, files) in enumerate(everyone):
    checks.true((spaces == namespaces) == (host == hosts[world.rank]), f"rank {rank}'s IPC and mount namespaces")
    if host != hosts[world.rank]:
        common_files = {(d, i) for d, i, _ in files} & {(d, i) for d, i, _ in mapped}
        checks.true(not common_files, f"ranks {world.rank} and {rank} map the same files: {common_files}")
peers = [set((d, i) for d, i, _ in files) for host, _, files in everyone if host == hosts[world.rank]]
checks.true(bool(set.intersection(*peers)), f"the ranks of {hosts[world.rank]} share no memory: {everyone}")
checks.finish()
