"""Under mpiexec: rank `argv[1]` raises while the others wait in a gradient reduction.

Without the abort hook that distributed.init installs, the others would wait forever."""
import sys

import numpy as np

from minidl import distributed, nn
from minidl.autograd import Tensor
from minidl.optim import SGD

comm = distributed.init()
model = nn.Linear(3, 2)
optimizer = SGD(model.parameters(), lr=0.1)
reducer = distributed.GradientReducer(distributed.AllReduce(comm, "torus2d"), optimizer.flat)
for step in range(3):
    if step == 1 and comm.rank == int(sys.argv[1]):
        raise RuntimeError("a deliberate failure")
    optimizer.zero_grad()
    reducer.backward(model(Tensor(np.ones((2, 3), np.float32))).sum())
    reducer.wait()
print("no rank failed")
