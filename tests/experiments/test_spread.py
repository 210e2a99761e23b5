"""Part 1 across BLAS kernels and the run store: B* over resamples of seeds and kernels against an
exact enumeration, the spreads against closed forms, the store as the study's cache across
machines, and the flags' one-line errors."""
import argparse
import itertools
import json
import math
import statistics

import pytest

from minidl.experiments.large_batch import cli, report, spread
from minidl.experiments.large_batch.store import Store, blas_kernel
from tests.experiments.test_experiments import counting_trainer, error_line, tiny

BATCHES = [32, 64, 128]


def exact_distribution(table, batches, size):
    """B*'s distribution by enumerating every draw of `size` seeds and every kernel choice for each, with
    its probability: the naive oracle of spread.b_star_distribution's sampling."""
    seeds = sorted({s for runs in table.values() for s in runs})
    kernels_of = {s: [k for k in sorted(table) if s in table[k]] for s in seeds}
    probability = dict.fromkeys(batches, 0.0)
    for draw in itertools.product(seeds, repeat=size):
        for choice in itertools.product(*(kernels_of[s] for s in draw)):
            weight = math.prod(1 / (len(seeds) * len(kernels_of[s])) for s in draw)
            rows = [table[k][s] for s, k in zip(draw, choice)]
            columns = list(zip(*rows))
            points = [(b, statistics.mean(c), statistics.stdev(c) if size > 1 else 0.0)
                      for b, c in zip(batches, columns)]
            probability[report.critical_batch(points)] += weight
    return probability


def test_b_star_over_seeds_and_kernels_matches_an_exact_enumeration():
    # seed 2 ran under kernel A only: a draw of it always takes A, a draw of 0 or 1 takes A or B half the time
    table = {"A": {0: [3.0, 3.1, 5.0], 1: [2.5, 2.4, 2.6], 2: [3.2, 4.4, 4.0]},
             "B": {0: [2.9, 3.6, 3.4], 1: [2.7, 2.5, 4.9]}}
    for size in (2, 3):
        sampled = spread.b_star_distribution(table, BATCHES, size, resamples=4000)
        exact = exact_distribution(table, BATCHES, size)
        assert abs(sum(exact.values()) - 1) < 1e-9
        for batch in BATCHES:  # 4,000 draws: the binomial std is at most 0.008
            assert abs(sampled[batch] - exact[batch]) < 0.035, (size, batch, sampled, exact)


def test_one_kernel_gives_the_bootstrap_over_seeds_exactly():
    errors = {32: [2.4, 2.5, 2.5, 3.8, 3.3], 64: [3.1, 2.3, 2.5, 2.5, 2.8], 128: [2.2, 3.0, 2.8, 2.9, 3.1]}
    table = {"only": {seed: [errors[b][seed] for b in BATCHES] for seed in range(5)}}
    for size in (2, 5):
        assert spread.b_star_distribution(table, BATCHES, size) == report.b_star_distribution(errors, size)


def test_spreads_across_seeds_and_across_kernels_are_pooled_variances():
    table = {"A": {0: [1.0], 1: [3.0], 2: [5.0]}, "B": {0: [2.0], 1: [2.0]}}
    (row,) = spread.row_spreads(table, [32])
    # across seeds: variances 4 (A) and 0 (B); across kernels: seed 0 (1, 2) → 0.5, seed 1 (3, 2) → 0.5
    assert row.cells == 5 and row.mean == pytest.approx(13 / 5)
    assert row.across_seeds == pytest.approx(math.sqrt(2)) and row.across_kernels == pytest.approx(math.sqrt(0.5))
    assert math.isnan(spread.row_spreads({"A": {0: [1.0]}}, [32])[0].across_kernels)


def test_a_seed_counts_only_under_a_kernel_that_ran_every_batch():
    errors = {"A": {(32, 0): 1.0, (64, 0): 2.0, (32, 1): 1.5}, "B": {(32, 1): 1.4, (64, 1): 2.2}}
    assert spread.cells(errors, [32, 64]) == {"A": {0: [1.0, 2.0]}, "B": {1: [1.4, 2.2]}}
    assert spread.seed_counts(10) == [4, 6, 8, 10] and spread.seed_counts(5) == [4, 5]
    assert spread.seed_counts(3) == [3] and spread.seed_counts(1) == []


def test_the_store_keeps_runs_across_machines_by_kernel(tmp_path, monkeypatch):
    calls = counting_trainer(monkeypatch)
    store = tmp_path / "runs.jsonl"
    flags = tiny(tmp_path, "--lr-sweep", "0.1", "--seeds", "0", "--store", str(store))
    assert cli.main(flags) == 0 and len(calls) == 1
    (record,) = [json.loads(line) for line in store.read_text().splitlines()]
    assert record["kernel"] == blas_kernel() and record["row"] == "b32-gradual" and record["seed"] == 0
    (tmp_path / "out").rename(tmp_path / "lost")  # another machine: the run folders are gone, the store is not
    calls.clear()
    assert cli.main(flags) == 0 and calls == [] and len(store.read_text().splitlines()) == 1
    store.write_text(json.dumps(dict(record, kernel="another kernel")) + "\n")  # not this kernel's run
    (tmp_path / "out").rename(tmp_path / "lost2")
    assert cli.main(flags) == 0 and len(calls) == 1 and len(Store(store).records) == 2


def test_a_damaged_store_or_bad_kernels_flag_is_one_line(tmp_path, capsys):
    store = tmp_path / "runs.jsonl"
    store.write_text('{"row": "b32-gradual"}\nnot json\n')
    assert cli.main(tiny(tmp_path, "--store", str(store))) == 2
    assert "line 1 of the run store" in error_line(capsys) and store.read_text().endswith("not json\n")
    assert cli.main(tiny(tmp_path, "--kernels", "Haswell,SkylakeX", "--parts", "1")) == 2
    assert "add --store FILE" in error_line(capsys)
    assert cli.main(tiny(tmp_path, "--kernels", "Haswell,SkylakeX", "--store", str(tmp_path / "s.jsonl"))) == 2
    assert "add --parts 1" in error_line(capsys)
    assert cli.main(tiny(tmp_path, "--kernels", "Has well")) == 2 and "not an OpenBLAS core type" in error_line(capsys)


def test_an_avx512_core_type_on_a_cpu_without_avx512_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "cpu_flags", lambda: {"sse2", "avx", "avx2", "fma"})
    assert cli.main(tiny(tmp_path, "--kernels", "SkylakeX", "--parts", "1")) == 2
    assert "--kernels SkylakeX: its kernels need AVX-512, which this CPU lacks" in error_line(capsys)
    assert not (tmp_path / "out" / "runs").exists()  # refused before any run
    args = argparse.Namespace(kernels=["SkylakeX"], store=None, parts=[1], lr_sweep=None)
    monkeypatch.setattr(cli, "cpu_flags", lambda: {"avx2", "avx512f"})
    assert cli.check_kernels(args) is None  # an AVX-512 CPU runs it
    monkeypatch.setattr(cli, "cpu_flags", set)
    assert cli.check_kernels(args) is None  # flags unknown (no /proc/cpuinfo): not refused


def test_the_kernel_comparison_reads_the_stores_part_1(tmp_path):
    from minidl.experiments.large_batch.rows import Design, Row, config_for
    from minidl.experiments.large_batch.runs import settings_of
    design = Design(max_batch=64)
    records = [{"kernel": kernel, "row": Row(batch).key, "seed": seed, "val_error": error, "diverged": None,
                "wall_seconds": 1.0, "settings": settings_of(config_for(Row(batch), seed, design, ".", "."), design)}
               for kernel, errors in (("A", [[2.0, 2.1], [3.0, 2.9], [2.5, 3.5]]), ("B", [[2.2, 2.0], [2.8, 3.1]]))
               for seed, row in enumerate(errors) for batch, error in zip((32, 64), row)]
    other = dict(records[0], settings=dict(records[0]["settings"], lr=9.0))  # another design: not counted
    text, paths = spread.compare_kernels(design, records + [other], tmp_path)
    assert "5 complete sweeps of 3 seeds" in text and "| 32 | 5 |" in text and [p.name for p in paths][:2] == ["kernels.md",
                                                                                                     "kernels.json"]
    saved = json.loads((tmp_path / "kernels.json").read_text())
    assert saved["errors"]["A"]["2"] == [2.5, 3.5] and list(saved["b_star_by_seed_count"]) == ["3"]


def test_a_core_type_openblas_did_not_take_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Foo")  # as after the restart: the process already has it
    assert cli.main(tiny(tmp_path, "--kernels", "Foo", "--parts", "1")) == 2
    assert f"OpenBLAS computes with {blas_kernel().split()[-1]} kernels instead" in error_line(capsys)
    assert not (tmp_path / "out" / "runs").exists()  # refused before any run
