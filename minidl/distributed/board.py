"""The node's board: what each rank of one node is doing, in memory the node's ranks share.

Each rank writes its own row (its heartbeat, step and activity); any rank of the node reads every
row, a stopped rank's last one included, without a message: the watchdog's view of its node.

Details: docs/distributed.md, "minidl/distributed/board.py".
"""
import time
from typing import NamedTuple

import numpy

from minidl.distributed.launch import load_mpi

FIELDS = ("rank", "beat", "step", "activity", "bucket", "waiting")
COLUMN = {name: index for index, name in enumerate(FIELDS)}
# what a rank can be doing (minidl.distributed.watchdog.doing); "bucket k" is the bucket and its number
ACTIVITIES = ("start", "data", "forward", "backward", "bucket", "decision", "update", "checkpoint", "eval")
CODE = {name: code for code, name in enumerate(ACTIVITIES)}


class Seen(NamedTuple):
    """One rank as a board shows it: how long ago it last beat, and where it was then."""
    age: float
    step: int
    activity: str
    waiting: bool


def encode(activity):
    """'bucket 3' -> (code of 'bucket', 3); 'forward' -> (code of 'forward', -1)."""
    name, _, number = activity.partition(" ")
    return CODE[name], int(number) if number else -1


def decode(code, number):
    name = ACTIVITIES[int(code)]
    return f"{name} {int(number)}" if number >= 0 else name


class NodeBoard:
    """A table of one row per rank of a node, in an MPI shared-memory window over `node` (an mpi4py
    communicator of ranks that share memory). Collective over `node` to make."""

    def __init__(self, node, world_rank):
        width = len(FIELDS) * 8
        # the node's first rank allocates every row, so that one view spans the table
        self.window = load_mpi().Win.Allocate_shared(width * node.Get_size() if node.Get_rank() == 0 else 0, 8,
                                                     comm=node)
        memory, _ = self.window.Shared_query(0)
        self.rows = numpy.frombuffer(memory, numpy.float64).reshape(node.Get_size(), len(FIELDS))
        self.row = self.rows[node.Get_rank()]
        self.row[:] = -1
        self.row[COLUMN["rank"]] = world_rank
        node.Barrier()  # every row named before anyone reads one

    def write(self, step, activity, waiting):
        """This rank's row: a heartbeat now, and where it is (`activity` as `encode` gives it)."""
        self.row[1:] = time.monotonic(), step, *activity, waiting

    def snapshot(self):
        """[(world rank, age of its heartbeat in seconds, step, activity code, bucket, waiting)] of the
        node's ranks that have beaten, as float rows: ages, not times, travel to other machines."""
        rows = self.rows.copy()
        rows = rows[rows[:, COLUMN["beat"]] >= 0]
        rows[:, COLUMN["beat"]] = time.monotonic() - rows[:, COLUMN["beat"]]
        return rows


def read(rows):
    """{world rank: Seen} of snapshot rows."""
    return {int(row[0]): Seen(float(row[1]), int(row[2]), decode(row[3], row[4]), bool(row[5])) for row in rows}
