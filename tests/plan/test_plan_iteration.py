"""One simulated iteration against timelines worked out by hand: when each bucket launches, when
the reducer sees a stage done (only at a gradient delivered, until backward ends), one stream
for every collective, the exposed tail, accumulation and the input pipeline."""
import pytest

from minidl.plan.iteration import simulate
from minidl.plan.stages import Bucket, Stage


def bucket(parameters, stages=2):
    return Bucket(0, 1, tuple(parameters), tuple(Stage("row", "allreduce", 2, 2, 8) for _ in range(stages)))


def test_one_bucket_final_at_the_end_is_all_exposed():
    it = simulate(forward=1.0, backward=2.0, update=0.5, accum=1, final_fractions=[1.0], buckets=[bucket([0])],
                  stage_seconds=[[0.4, 0.3]])
    # backward runs 1..3; the bucket launches at 3, its stages 3..3.4..3.7
    assert it.exposed == pytest.approx(0.7) and it.communication == pytest.approx(0.7)
    assert it.seconds == pytest.approx(1 + 2 + 0.7 + 0.5) and it.compute_only == pytest.approx(3.5)
    assert [(s.start, s.end) for s in it.stages] == [(3.0, pytest.approx(3.4)),
                                                     (pytest.approx(3.4), pytest.approx(3.7))]


def test_a_stage_done_is_seen_at_the_next_gradient_and_the_stream_keeps_order():
    # gradients at 1.5 (bucket 0) and 3.0 (bucket 1, the end of backward)
    it = simulate(1.0, 2.0, 0.0, 1, [0.25, 1.0], [bucket([0]), bucket([1])], [[0.2, 0.2], [0.3, 0.1]])
    # 1.5: b0 stage 0 runs to 1.7, unseen until 3.0; at 3.0 b1 launches first (3.0-3.3), then b0's
    # stage 1 queues behind it (3.3-3.5); wait() finishes b0 (3.5) before it looks at b1, whose
    # stage 1 then runs 3.5-3.6
    assert [(s.bucket, s.index, s.issued, s.start, s.end) for s in it.stages] == [
        (0, 0, 1.5, 1.5, pytest.approx(1.7)), (1, 0, 3.0, 3.0, pytest.approx(3.3)),
        (0, 1, 3.0, pytest.approx(3.3), pytest.approx(3.5)), (1, 1, pytest.approx(3.5), pytest.approx(3.5),
                                                             pytest.approx(3.6))]
    assert it.exposed == pytest.approx(0.6) and it.bucket_final == (1.5, 3.0)


def test_buckets_done_during_backward_hide_everything():
    # gradients at 1.5, 2.0, 2.5 and 3.0; bucket 0 (1.5) 1.5-1.7 seen at 2.0: 2.0-2.2 behind nothing
    it = simulate(1.0, 2.0, 0.0, 1, [0.25, 0.5, 0.75, 1.0], [bucket([0]), bucket([1, 2], stages=1)],
                  [[0.2, 0.2], [0.1]])
    # 2.5: bucket 1 final, launched: 2.5-2.6, all before backward ends at 3.0
    assert [(s.bucket, s.start, s.end) for s in it.stages] == [(0, 1.5, pytest.approx(1.7)),
                                                               (0, 2.0, pytest.approx(2.2)),
                                                               (1, 2.5, pytest.approx(2.6))]
    assert it.exposed == 0 and it.communication == pytest.approx(1.1)


def test_accumulation_overlaps_only_the_last_backward():
    it = simulate(1.0, 2.0, 0.0, 3, [1.0], [bucket([0], stages=1)], [[0.5]])
    assert it.forward == 3 and it.backward == 6 and it.backward_end == 9
    assert it.stages[0].start == 9 and it.exposed == pytest.approx(0.5)


def test_an_empty_bucket_leaves_when_backward_starts_and_no_bucket_costs_nothing():
    it = simulate(1.0, 2.0, 0.0, 1, [1.0], [bucket([]), bucket([0], stages=1)], [[0.5, 0.5], [0.5]])
    assert it.bucket_final == (1.0, 3.0) and it.stages[0].start == 1.0
    alone = simulate(1.0, 2.0, 0.25, 1, [1.0], [], [])
    assert alone.exposed == 0 and alone.communication == 0 and alone.seconds == pytest.approx(3.25)


def test_the_input_pipeline_is_waited_for_only_beyond_the_step():
    slow = simulate(1.0, 2.0, 0.0, 1, [1.0], [bucket([0], stages=1)], [[0.5]], data=5.0)
    assert slow.data_wait == pytest.approx(1.5) and slow.seconds == 5.0 and slow.compute_only == 5.0
    fast = simulate(1.0, 2.0, 0.0, 1, [1.0], [bucket([0], stages=1)], [[0.5]], data=1.0)
    assert fast.data_wait == 0 and fast.seconds == pytest.approx(3.5)
