"""The ranks' recordings as one file in the Chrome Trace Event Format, which Perfetto
(ui.perfetto.dev) and chrome://tracing open.

The JSON object form: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}.
Each rank is a process (pid = rank) and each track a thread (tid 0: compute; tid k + 1: bucket
k's communication), named and ordered by metadata events (ph "M": process_name,
process_sort_index, thread_name, thread_sort_index). Each interval is a complete event
(ph "X") with its start `ts` and duration `dur` in microseconds, a category `cat` (below) and
its `args`. Times are on rank 0's clock: rank r's minus r's measured offset
(minidl.distributed.clock), from the earliest event of the trace.
"""
STEP, PHASE, FORWARD, BACKWARD, BUCKET, STAGE, EVALUATION = (
    "step", "phase", "forward", "backward", "bucket", "allreduce", "evaluation")
COMPUTE_TRACK = 0  # the tid of the compute track


def document(recordings, offsets, about):
    """The trace of `recordings` (one per rank, in rank order: {"rank", "host", "tracks": [track
    names], "intervals": [(track, name, category, start, end, args)] in seconds}), `offsets`
    ([(offset, uncertainty)] seconds per rank) and `about` (what otherData says of the run)."""
    origin = min((start - offsets[r["rank"]][0] for r in recordings for _, _, _, start, _, _ in r["intervals"]),
                 default=0.0)

    def microseconds(seconds, rank):
        return round((seconds - offsets[rank][0] - origin) * 1e6, 3)

    events = []
    for recording in recordings:
        rank = recording["rank"]
        events += [metadata("process_name", rank, 0, name=f"rank {rank} ({recording['host']})"),
                   metadata("process_sort_index", rank, 0, sort_index=rank)]
        for tid, name in enumerate(recording["tracks"]):
            events += [metadata("thread_name", rank, tid, name=name), metadata("thread_sort_index", rank, tid,
                                                                               sort_index=tid)]
        for track, name, category, start, end, args in recording["intervals"]:
            ts = microseconds(start, rank)
            events.append({"name": name, "cat": category, "ph": "X", "ts": ts,
                           "dur": round(microseconds(end, rank) - ts, 3), "pid": rank, "tid": track, "args": args})
    alignment = {"method": "ping-pong with rank 0 before the first traced step: offset = the peer's clock minus "
                           "the midpoint of rank 0's send and receive, from the round with the shortest round trip",
                 "offset_us": [round(offset * 1e6, 3) for offset, _ in offsets],
                 "uncertainty_us": [round(uncertainty * 1e6, 3) for _, uncertainty in offsets]}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {**about, "clock_alignment": alignment}}


def metadata(kind, pid, tid, **args):
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}
