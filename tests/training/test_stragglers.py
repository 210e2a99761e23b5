"""The straggler statistics (minidl.training.stragglers) against plain loops over the steps."""
import statistics

import numpy as np
import pytest

from minidl.training.stragglers import Stragglers


def steps_of(compute, wait):
    stragglers = Stragglers()
    for c, w in zip(compute, wait):
        stragglers.add(np.array([c, w]).T)
    return stragglers


def test_window_and_epoch_spread_slowest_rank_and_the_wait_it_caused():
    rng = np.random.default_rng(0)
    compute = rng.uniform(0.1, 0.2, (12, 4))
    compute[:9, 2] *= 1.5  # rank 2 is >= 1.2 times the others' median in 9 of 12 steps
    wait = rng.uniform(0, 0.05, (12, 4))
    stragglers = steps_of(compute, wait)
    report, epoch = stragglers.report(), stragglers.epoch_report()
    rows = [list(step) for step in compute]
    assert report["compute_fastest"] == pytest.approx(statistics.mean(min(r) for r in rows))
    assert report["compute_median"] == pytest.approx(statistics.mean(statistics.median(r) for r in rows))
    assert report["compute_slowest"] == pytest.approx(statistics.mean(max(r) for r in rows))
    assert report["rank_compute"] == pytest.approx([statistics.mean(r[k] for r in rows) for k in range(4)])
    assert report["rank_wait"] == pytest.approx([statistics.mean(w[k] for w in wait) for k in range(4)])
    slowest = [r.index(max(r)) for r in rows]
    assert report["slowest_rank"] == statistics.mode(slowest)
    assert report["slowest_share"] == pytest.approx(slowest.count(statistics.mode(slowest)) / 12)
    caused = [statistics.mean(max(r) - x for k, x in enumerate(r) if k != r.index(max(r))) for r in rows]
    assert report["straggler_wait"] == pytest.approx(statistics.mean(caused))
    slower = [sum(r[k] >= 1.2 * statistics.median(r[:k] + r[k + 1:]) for r in rows) / 12 for k in range(4)]
    assert slower[2] > 0.5 and epoch["straggler"] == 2 and epoch["straggler_share"] == pytest.approx(slower[2])
    assert all(epoch[key] == pytest.approx(value) for key, value in report.items())  # the same steps
    assert "straggler" not in report
    assert stragglers.report() == {} and stragglers.epoch_report() == {}  # both windows start afresh


def test_two_ranks_compare_with_the_other_rank_and_no_straggler_when_even():
    even = steps_of([[0.10, 0.11], [0.12, 0.10]] * 5, [[0, 0]] * 10).epoch_report()
    assert even["straggler"] is None
    slow = steps_of([[0.10, 0.125]] * 6 + [[0.10, 0.10]] * 4, [[0, 0]] * 10).epoch_report()
    assert slow["straggler"] == 1 and slow["straggler_share"] == pytest.approx(0.6)
