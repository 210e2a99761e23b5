"""How far each rank's clock is from rank 0's, measured by ping-pong with rank 0.

Rank 0 reads its clock (t0), sends rank r a message, and reads it again (t1) when the reply
arrives; the reply carries r's clock at the moment r answered (tr). That moment lies between
t0 and t1 on rank 0's clock, so r's clock minus rank 0's is tr − (t0 + t1)/2 within
±(t1 − t0)/2. Of several rounds, the one with the shortest round trip gives the tightest bound.
The ranks are measured one after another over a private duplicate of the communicator.
"""
import numpy

ROUNDS = 20


def clock_offsets(comm, clock, rounds=ROUNDS):
    """On rank 0: [(offset, uncertainty)] in seconds for every rank, where rank r's `clock()`
    reads rank 0's plus the offset, within ± the uncertainty; None on the other ranks.
    Collective: every rank calls it with its own clock (a function returning seconds)."""
    if comm.size == 1:
        return [(0.0, 0.0)]
    channel = comm.mpi.Dup()
    message = numpy.zeros(1)
    try:
        if comm.rank == 0:
            return [(0.0, 0.0)] + [_measure(channel, rank, clock, message, rounds) for rank in range(1, comm.size)]
        for _ in range(rounds):
            channel.Recv(message, source=0)
            message[0] = clock()
            channel.Send(message, dest=0)
        return None
    finally:
        channel.Free()


def _measure(channel, rank, clock, message, rounds):
    best = None
    for _ in range(rounds):
        sent = clock()
        channel.Send(message, dest=rank)
        channel.Recv(message, source=rank)
        received = clock()
        estimate = (float(message[0]) - (sent + received) / 2, (received - sent) / 2)
        if best is None or estimate[1] < best[1]:
            best = estimate
    return best
