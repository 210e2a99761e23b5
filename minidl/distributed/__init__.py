"""Data-parallel training over MPI and NCCL.

Every rank holds the whole model, computes gradients on its own part of the global batch,
and the ranks SUM their flat gradient buffers before the identical update. The trainer's
calls, in order:

    from minidl import distributed
    comm = distributed.init(backend)                  # world; GPU local_rank % count; abort on failure
    allreduce = distributed.AllReduce(comm, "torus2d", shape)   # or "ring", "hierarchical"
    model = ...                                # the same construction on every rank
    distributed.broadcast_state(comm, model.state_dict().values())   # rank 0's parameters and buffers
    optimizer = SGD(model.parameters(), ..., grad_scale=1 / comm.size,
                    align=math.lcm(1024, allreduce.alignment))
    reducer = distributed.GradientReducer(allreduce, optimizer.flat, bucket_mb)
    for each step:
        optimizer.zero_grad()
        loss = loss_fn(model(x_rank), y_rank)  # the MEAN over this rank's batch
        reducer.backward(loss)                 # instead of loss.backward(): overlapped reduction
        reducer.wait()                         # flat.grad = SUM over ranks
        optimizer.step()
    totals = comm.sum([loss_sum, correct, count])   # metrics over all ranks (every rank calls)

Every rank must make the same calls in the same order (they are collectives), so each rank
runs the same number of steps (the sampler gives every rank equally many batches). Nothing is
needed at the end. An uncaught exception aborts the job (init installs the hook); a deliberate
exit on one rank, such as a UserError caught to exit with status 2, must call
`comm.abort(2)` instead of sys.exit when comm.size > 1, or the others wait for it forever.

Gradient averaging (Goyal et al., remark 3): the all-reduce leaves the SUM of the ranks'
gradients; nothing divides the buffer. With each rank's loss the mean over its b images, the
sum is k·(mean gradient over the global batch of k·b), so `grad_scale = 1 / comm.size`; with a
per-rank SUM loss, `grad_scale = 1 / (global batch)`. Weight decay is added by the optimizer
after the scale, on every rank alike, and is never all-reduced. BN running statistics are
per rank (not reduced): rank 0's are the ones saved.

With one rank (a plain `python train.py`) no MPI is needed: the same calls work and every
collective is a no-op. Only `comm.rank == 0` should print or write files.
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
