"""Under mpiexec: NCCL communicators are created per group with the group's rank 0's unique id.

No GPU here: a stand-in for cupy.cuda.nccl records what NcclTransport asks of it."""
import itertools

from common import Checks

from minidl import distributed
from minidl.distributed.nccl_transport import NcclTransport
from minidl.errors import UserError


class FakeNccl:
    ids = itertools.count()

    def __init__(self, rank):
        self.rank, self.created = rank, []

    def get_unique_id(self):
        return f"id {next(self.ids)} made by world rank {self.rank}"

    def NcclCommunicator(self, size, unique_id, rank):
        self.created.append((size, unique_id, rank))
        return len(self.created)


comm = distributed.init()
checks = Checks(comm)
rank, size = comm.rank, comm.size
fake = FakeNccl(rank)
world = NcclTransport(comm.mpi, stream="the stream", nccl=fake)
rows = world.for_group(comm.mpi.Split(rank // 2, rank))
checks.true(rows.stream == "the stream" and rows.nccl is fake, "a group's transport shares the stream")
first_of_row = rank - rank % 2
row_size = min(2, size - first_of_row)
checks.true(fake.created == [(size, "id 0 made by world rank 0", rank),
                             (row_size, f"id {int(first_of_row == 0)} made by world rank {first_of_row}", rank % 2)],
            f"NCCL communicators {fake.created}")
if size > 1:
    checks.raises(UserError, "nccl backend needs CuPy", lambda: distributed.Communicator("nccl"), "nccl without a GPU")
checks.finish()
