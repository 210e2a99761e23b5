"""Under mpiexec -n 2, on the emulated kernels (MINIDL_DEVICE_KERNELS=emulated_device:device):
the tuner's agreement over the ranks (minidl.training.build). Argument "nodes": each rank its
own node (MINIDL_RANKS_PER_NODE=1), so both validate and rank 1's node finds one kernel
failing, which rank 0 must then not choose; "node": one node, where rank 1 does not validate.
Either way only rank 0's timer runs and both ranks end with the same choices."""
import itertools
import os
import sys

import numpy as np
from common import Checks

from minidl import distributed, kernels
from minidl.kernels.autotune import Plan
from minidl.training.build import agree_on_kernel_plans

mode = sys.argv[1]
comm = distributed.init()
checks = Checks(comm)
os.environ["MINIDL_CACHE"] = os.path.join(os.environ["MINIDL_CACHE"], f"rank{comm.rank}")  # a cache per node
device_kernels = kernels.device()
agree_on_kernel_plans(comm)
tuner = device_kernels.tuner
LAST = Plan("v3", "bf16_128x256")  # the forward pass's last plan: rank 0's timer would pick it
FAILING = LAST.kernel_name("conv_fwd")
validations, timed = [], []


def validate(known, record):  # the canary's part, faked: every kernel ok, but one on rank 1's node
    validations.append(comm.rank)
    from minidl.kernels import canary
    for plan in canary.PLANS:
        failing = plan.name == FAILING and comm.rank == 1
        record(plan.name, {"status": "failed" if failing else "ok", "error": "injected" if failing else None,
                           "max_error": None, "seconds": 0.0})


later_is_faster = itertools.count(100.0, -1.0)
tuner.validate = validate
tuner.timer = lambda function: timed.append(comm.rank) or next(later_is_faster)
rng = np.random.default_rng(comm.rank)  # different data per rank, as in training
x = (rng.standard_normal((2, 5, 5, 64)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
w = (rng.standard_normal((64, 1, 1, 64)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
gy = device_kernels.conv_forward(x, w, 1, 0)
device_kernels.conv_grad_weight(x, gy, w.shape, 1, 0)

choices = comm.allgather_object(tuner.report()["choices"])
checks.true(len(choices[0]) == 2 and choices[0] == choices[1], f"the same choices on every rank: {choices}")
checks.true(all(label != LAST.label() for key, label in choices[0].items()
                if key.startswith("conv_fwd")) if mode == "nodes" else True, "a kernel failed elsewhere is not chosen")
checks.true(not any(label.startswith("v1") for label in choices[0].values()), f"rank 0's timer decided: {choices[0]}")
checks.true((timed == []) == (comm.rank == 1) and set(timed) <= {0}, f"rank {comm.rank} timed {len(timed)} calls")
leads = comm.rank == 0 or mode == "nodes"
checks.true(validations == ([comm.rank] if leads else []), f"rank {comm.rank} validated {validations}")
checks.finish()
