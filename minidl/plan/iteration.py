"""One training iteration on one rank, simulated: forward, backward, the buckets' all-reduces
overlapping backward as the gradient reducer runs them, the update.

Every rank runs alike. The reducer launches buckets in order once their gradients are final, looks
at its stages at every gradient delivered and, after backward, waits for them bucket by bucket;
collectives run one at a time on one communication stream, as NCCL's do. The step waits for what
is left of the exchange when backward ends: the exposed tail.

Details: docs/plan.md, "One iteration".
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class StageRun:
    bucket: int
    index: int
    group: str
    op: str
    ranks: int
    nbytes: int
    issued: float  # seconds from the iteration's start
    start: float
    end: float


@dataclasses.dataclass(frozen=True)
class Iteration:
    forward: float  # seconds, every micro-batch together
    backward: float
    exposed: float  # communication the step waits for after backward
    update: float
    data: float  # what the input pipeline needs for the iteration's images (it prefetches during the step)
    communication: float  # from the first stage's start to the last stage's end
    bucket_final: tuple  # seconds from the start at which each bucket's gradients were final
    stages: tuple  # StageRun of every stage, in the order they were issued

    @property
    def busy(self):
        return self.forward + self.backward + self.exposed + self.update

    @property
    def data_wait(self):
        """The input pipeline's time beyond the rest of the step."""
        return max(0.0, self.data - self.busy)

    @property
    def seconds(self):
        return self.busy + self.data_wait

    @property
    def compute_only(self):
        """The same iteration without communication."""
        return max(self.forward + self.backward + self.update, self.data)

    @property
    def backward_end(self):
        return self.forward + self.backward


def simulate(forward, backward, update, accum, final_fractions, buckets, stage_seconds, data=0.0):
    """The Iteration of `accum` micro-batches of `forward` + `backward` seconds each, the last one's
    backward overlapped with the exchange of `buckets` (stages.Bucket, launch order), whose stage j of
    bucket k takes stage_seconds[k][j]; `update` seconds of optimizer; `data` seconds of input pipeline."""
    backward_start = accum * forward + (accum - 1) * backward
    backward_end = backward_start + backward
    final_at = [backward_start + backward * fraction for fraction in final_fractions]
    bucket_final = [max((final_at[i] for i in bucket.parameters), default=backward_start) for bucket in buckets]
    reducer = Reducer(buckets, stage_seconds)
    for moment in sorted({backward_start, *final_at}):  # the reducer looks at every gradient delivered
        reducer.launch_final(moment, bucket_final)
        reducer.progress(moment)
    reducer.launch_final(backward_end, bucket_final)
    end = reducer.finish(backward_end)
    runs = reducer.runs
    communication = max((r.end for r in runs), default=0.0) - min((r.start for r in runs), default=0.0)
    return Iteration(accum * forward, accum * backward, max(0.0, end - backward_end), update, data, communication,
                     tuple(bucket_final), tuple(runs))


class Reducer:
    """The gradient reducer's state during one step: how far each bucket is, and the communication stream."""

    def __init__(self, buckets, stage_seconds):
        self.buckets, self.stage_seconds = buckets, stage_seconds
        self.launched = 0
        self.next = [0] * len(buckets)  # each bucket's next stage to start
        self.done_at = [0.0] * len(buckets)  # when its last started stage ends
        self.stream_free = 0.0
        self.runs = []

    def issue(self, k, moment):
        j = self.next[k]
        stage = self.buckets[k].stages[j]
        start = max(moment, self.stream_free)
        end = start + self.stage_seconds[k][j]
        self.runs.append(StageRun(k, j, stage.group, stage.op, stage.ranks, stage.nbytes, moment, start, end))
        self.stream_free = self.done_at[k] = end
        self.next[k] += 1

    def left(self, k):
        return self.next[k] < len(self.buckets[k].stages)

    def launch_final(self, moment, bucket_final):
        while self.launched < len(self.buckets) and bucket_final[self.launched] <= moment:
            k = self.launched
            self.launched += 1
            if self.left(k):
                self.issue(k, moment)

    def progress(self, moment):
        """Start what may start at `moment`: a bucket's next stage once its last is done, after the bucket
        before it has started that stage."""
        for k in range(self.launched):
            while self.left(k) and self.done_at[k] <= moment and not (k and self.next[k - 1] <= self.next[k]):
                self.issue(k, moment)

    def finish(self, moment):
        """After backward: each bucket in turn, its stages run to their end (the reducer's wait());
        when the last one ends."""
        for k in range(len(self.buckets)):
            while self.left(k):
                moment = max(moment, self.done_at[k])
                self.issue(k, moment)
            moment = max(moment, self.done_at[k])
        return moment
