"""Data-parallel training over MPI and NCCL.

Every rank holds the whole model, computes gradients on its own part of the global batch, and
the ranks SUM their flat gradient buffers before the identical update. The package gathers the
trainer's calls (`init`, `AllReduce`, `broadcast_state`, `GradientReducer`, `comm.sum`); every
rank makes them in the same order, as collectives demand, and with one rank they need no MPI.

Details: docs/distributed.md, "minidl/distributed/__init__.py".
"""
from minidl.distributed.allreduce import ALGORITHMS, AllReduce
from minidl.distributed.clock import clock_offsets
from minidl.distributed.comm import BACKENDS, Communicator
from minidl.distributed.grid import choose_grid, parse_shape, square_grid
from minidl.distributed.launch import launched_by_mpi
from minidl.distributed.reducer import GradientReducer
from minidl.distributed.world import broadcast_state, init, install_abort_hook

__all__ = ["ALGORITHMS", "AllReduce", "BACKENDS", "Communicator", "GradientReducer", "broadcast_state",
           "choose_grid", "clock_offsets", "init", "install_abort_hook", "launched_by_mpi", "parse_shape",
           "square_grid"]
