"""Part 6, LARS and SGD under You et al.'s protocol: its schedule against the closed form (in the
engine's schedule and in a real run's rates), its tuning against a hand-made table of errors, its
run list against the design as docs/recipe.md states it, its verdict rule on hand-made tables, and
its outputs and listing."""
import dataclasses
import json
import math
from pathlib import Path

import pytest

from minidl.errors import UserError
from minidl.experiments.large_batch import cli, protocol, rows, study
from minidl.experiments.large_batch.rows import Design, Row, protocol_row
from minidl.experiments.large_batch.runs import changed_settings, run_once, settings_of
from minidl.experiments.large_batch.store import Store, blas_kernel, provenance
from minidl.training.build import build_schedule
from tests.experiments.test_experiments import PNG, error_line

STORE = Path(__file__).parents[2] / "docs" / "large-batch-runs.jsonl"
# the design's grid: rates per 32 at each (batch, optimizer), SGD at 32 the reference
SGD_RATES, LARS_RATES = (0.05, 0.1, 0.2, 0.4), (0.25, 0.5, 1.0, 2.0, 4.0)
DESIGN_GRID = ({(32, "sgd", rate) for rate in SGD_RATES} | {(b, "sgd", rate) for b in (256, 512, 1024) for rate in SGD_RATES}
               | {(b, "lars", rate) for b in (256, 512, 1024) for rate in LARS_RATES})


def closed_form(rate, batch, t, warmup=2.0, epochs=10):
    """You et al.'s schedule as the design states it: from `rate` (per 32) linearly to rate·batch/32
    over the warmup, then (1 − progress)² to zero at the last epoch."""
    peak = rate * batch / 32
    if t < warmup:
        return rate + (peak - rate) * t / warmup
    return peak * (1 - (t - warmup) / (epochs - warmup)) ** 2


def config(row, seed=0, design=Design()):
    return rows.config_for(row, seed, design, "data", "out")


@pytest.mark.parametrize("batch,opt,rate", [(32, "sgd", 0.1), (512, "lars", 1.0), (1024, "sgd", 0.4)])
def test_the_poly_rows_schedule_is_the_closed_form(batch, opt, rate):
    schedule = build_schedule(config(protocol_row(batch, opt, rate)).resolved(), world_size=1)
    for t in [i / 16 for i in range(161)]:  # every sixteenth of an epoch from 0 to 10
        assert schedule(t) == pytest.approx(closed_form(rate, batch, t), rel=1e-12, abs=1e-15), t
    assert schedule(10.0) == 0.0 and schedule(2.0) == pytest.approx(rate * batch / 32)


def test_a_poly_row_differs_from_the_studys_row_in_its_schedule_only():
    def changed(a, b):
        a, b = a.to_dict(), b.to_dict()
        return {k for k in a if a[k] != b[k]}
    assert Design().lr == 0.2 and Design().lars_lr == 2.0
    assert changed(config(Row(256)), config(protocol_row(256, "sgd", 0.2))) == {"lr_scheduler", "lr_power"}
    assert changed(config(Row(256, opt="lars")), config(protocol_row(256, "lars", 2.0))) == {"lr_scheduler", "lr_power"}
    assert changed(config(protocol_row(256, "lars", 2.0)), config(protocol_row(256, "lars", 0.5))) == {
        "lr", "lr_warmup_start"}
    assert protocol_row(256, "lars", 0.5).key == "b256-gradual-poly-lr0.5-lars"
    assert protocol_row(32, "sgd", 0.05).name == "k·n = 32, poly decay, η = 0.05 per 32"


def test_the_published_part_1_runs_are_still_the_runs_part_1_asks_for():
    """The rows' new fields leave part 1's settings as the stored runs have them (nothing to rerun)."""
    records = [r for r in Store(STORE).records if r["seed"] == 0 and r["row"].endswith("-gradual")]
    assert {r["row"] for r in records} == {f"b{b}-gradual" for b in (32, 64, 128, 256, 512)}
    for record in records:
        row = Row(int(record["row"][1:].split("-")[0]))
        assert changed_settings(record["settings"], settings_of(config(row), Design())) == [], record["row"]


def test_the_run_list_is_the_designs_52_runs():
    design = Design()
    tuning = rows.protocol_tuning_rows(design)
    assert len(tuning) == 31 and {(row.batch, row.opt, row.lr) for row in tuning} == DESIGN_GRID
    assert design.tuning_seed == 100 and design.seeds == (0, 1, 2)
    for row in tuning:
        c = config(row, design.tuning_seed).resolved()
        assert (c.opt, c.lr, c.lr_warmup_start, c.batch_schedule) == (row.opt, row.lr, row.lr, f"0:{row.batch}")
        assert (c.lr_scheduler, c.lr_power, c.lr_warmup_method, c.lr_warmup_epochs, c.epochs) == (
            "poly", 2.0, "linear", 2.0, 10)
        assert (c.lars_eta, c.weight_decay, c.norm_weight_decay, c.momentum) == (0.001, 5e-4, 0.0, 0.9)
    best = {(batch, opt): LARS_RATES[0] if opt == "lars" else SGD_RATES[-1] for batch, opt in rows.protocol_cells(design)}
    reported = protocol.reported_rows(design, best)
    assert [(row.batch, row.opt) for row in reported] == [(32, "sgd")] + [(b, opt) for b in (256, 512, 1024)
                                                                          for opt in ("sgd", "lars")]
    assert len(reported) * len(design.seeds) + len(tuning) == 52


def fake_errors(design, best):
    """A run table: on the tuning seed each pair's error is lowest at `best` and grows with the distance
    in octaves; the reported seeds err by their seed."""
    def error(row, seed):
        if seed == design.tuning_seed:
            return 3.0 + abs(math.log2(row.lr / best[row.batch, row.opt])) + row.batch / 1e4
        return 2.0 + seed + (row.opt == "lars")
    return error


def test_the_tuning_picks_each_pairs_lowest_error_and_reports_its_seeds_there():
    design = Design()
    best = {(32, "sgd"): 0.05, (256, "sgd"): 0.4, (256, "lars"): 4.0, (512, "sgd"): 0.1, (512, "lars"): 0.25,
            (1024, "sgd"): 0.2, (1024, "lars"): 1.0}  # the grid's edges and its middle
    error, results, calls = fake_errors(design, best), {}, []

    def train(pairs):
        calls.append(list(pairs))
        results.update({(row, seed): {"val_error": error(row, seed)} for row, seed in pairs})

    assert protocol.run(design, results, train) == best
    tuning, reported = calls
    assert len(tuning) == 31 and {seed for _, seed in tuning} == {100}
    assert sorted((row.batch, row.opt, row.lr, seed) for row, seed in reported) == sorted(
        (batch, opt, rate, seed) for (batch, opt), rate in best.items() for seed in (0, 1, 2))
    calls.clear()
    assert protocol.run(design, results, train) == best and calls == [[], []]  # all done: nothing trains again
    tied = {**results, (protocol_row(32, "sgd", 0.4), 100): {"val_error": results[protocol_row(32, "sgd", 0.05), 100][
        "val_error"]}}
    assert protocol.best_rates(design, tied)[32, "sgd"] == 0.05  # of equal errors, the first rate of the grid


def view_of(errors):
    """{row: [results]} from {(batch, optimizer): [error per seed]}, each at rate 1."""
    return {protocol_row(batch, opt, 1.0): [{"val_error": e, "diverged": None} for e in errs]
            for (batch, opt), errs in errors.items()}


@pytest.mark.parametrize("lars_errors,b_stars,sentence", [
    # reference 3.2 ± 0.2: the band ends at 3.4. SGD: 256 within, 512 above, 1024 within after it (not counted)
    ((3.3, 3.35, 5.0), {"sgd": 256, "lars": 512}, "LARS moves B* from 256 to 512 (×2)"),
    ((3.3, 3.3, 3.3), {"sgd": 256, "lars": 1024}, "LARS moves B* from 256 to 1024 (×4)"),
    ((3.3, 6.0, 3.3), {"sgd": 256, "lars": 256}, "LARS does not move B* under You et al.'s protocol: 256 with LARS, "
                                                 "256 with SGD"),
    ((4.0, 3.3, 3.3), {"sgd": 256, "lars": 32}, "LARS does not move B* under You et al.'s protocol: 32 with LARS, "
                                                "256 with SGD"),
])
def test_the_verdict_rule_on_hand_made_tables(lars_errors, b_stars, sentence):
    errors = {(32, "sgd"): [3.0, 3.2, 3.4], (256, "sgd"): [3.3, 3.3, 3.3], (512, "sgd"): [5.0, 5.0, 5.0],
              (1024, "sgd"): [3.1, 3.1, 3.1]}
    errors.update({(batch, "lars"): [e] * 3 for batch, e in zip((256, 512, 1024), lars_errors)})
    assert protocol.b_stars(view_of(errors)) == b_stars
    assert protocol.verdict(b_stars).startswith(sentence)


def tiny_design():
    return Design(image_size=8, train_per_class=52, val_per_class=2, epochs=2, warmup_epochs=1.0, workers=0,
                  max_batch=64, seeds=(0, 1), batch_seeds=(0, 1), protocol_b_star=32, protocol_lars_rates=(0.5, 1.0),
                  protocol_sgd_rates=(0.1, 0.2))


def test_a_real_run_of_a_poly_row_trains_at_the_closed_forms_rates(tmp_path):
    design = tiny_design()
    data = study.dataset(design, tmp_path / "cache")
    row = protocol_row(64, "lars", 0.5)
    result = run_once(row, 0, design, data, tmp_path / "out")
    assert not result["cached"] and result["steps"] == 2 * (520 // 64)
    metrics = [json.loads(line) for line in
               (tmp_path / "out" / "runs" / f"{row.key}-seed0" / "metrics.jsonl").read_text().splitlines()]
    steps = 520 // 64  # an epoch's last step is at t = epoch + 7/8: once in the warmup, once in the decay
    assert [m["lr"] for m in metrics] == pytest.approx(
        [closed_form(0.5, 64, e + (steps - 1) / steps, warmup=1.0, epochs=2) for e in range(2)], rel=1e-12)
    assert run_once(row, 0, design, data, tmp_path / "out")["cached"]


def test_the_study_reports_part_6_from_its_runs(tmp_path, monkeypatch):
    """With a fake run (no training): the tuning's table, each pair's best rate, the verdict, the figure."""
    design = tiny_design()
    best = {(32, "sgd"): 0.2, (64, "sgd"): 0.1, (64, "lars"): 1.0, (128, "sgd"): 0.2, (128, "lars"): 0.5,
            (256, "sgd"): 0.1, (256, "lars"): 1.0}
    error = fake_errors(design, best)
    trained = []

    def fake_run(row, seed, *_):
        trained.append((row, seed))
        value = error(row, seed) if row.schedule == "poly" else 3.0 + seed
        return {"val_error": value, "diverged": None, "seed": seed, "wall_seconds": 1.0, "cached": True}

    monkeypatch.setattr(study, "run_once", fake_run)
    done = study.run_study(design, tmp_path / "out", tmp_path / "cache", selected=(1, 6))
    assert len(trained) == 2 * 2 + 7 * 2 + 7 * 2  # part 1, the tuning, the reported seeds
    assert done.protocol_rates == best
    (tmp_path / "out").mkdir()  # the command line makes it; the fake run makes no run folder in it
    study.write_outputs(done, tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    part = results["lars_protocol"]
    assert part["best_rates"] == {f"b{batch}-{opt}": rate for (batch, opt), rate in best.items()}
    # every reported LARS seed errs 1 point more than SGD's: 3.5 ± 0.71 against the reference's 2.5 ± 0.71
    assert part["b_star"] == {"sgd": 256, "lars": 32} and part["verdict"].startswith("LARS does not move B*")
    assert list(results["parts"]) == ["batch", "lars-protocol"]
    assert set(results["parts"]["lars-protocol"]["rows"]) == {protocol_row(b, o, r).key for (b, o), r in best.items()}
    table = (tmp_path / "out" / "table.md").read_text()
    assert "Part 6" in table and "| 64 | LARS | 0.5: 4.01, 1: 3.01 | 1 |" in table
    assert (tmp_path / "out" / "lars-protocol.png").read_bytes()[:8] == PNG


def test_the_list_names_the_52_runs_and_which_are_done(tmp_path, capsys):
    design = Design()
    done_row = protocol_row(512, "lars", 2.0)
    store = Store(tmp_path / "store.jsonl")
    store.add({**provenance(), "row": done_row.key, "seed": 100, "val_error": 4.0,
               "settings": settings_of(config(done_row, 100), design)})
    assert store.records[0]["kernel"] == blas_kernel()
    flags = ["--parts", "6", "--list", "--output-dir", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"),
             "--store", str(store.path)]
    assert cli.main(flags) == 0
    lines = capsys.readouterr().out.splitlines()
    part6 = lines[lines.index(next(line for line in lines if line.startswith("part 6, tuning"))):]
    runs = [line for line in part6 if line.startswith("  ")]
    assert len(runs) == 52 and part6[-1] == "part 6 in all: 52 runs, 1 done"
    assert f"  {done_row.name}, seed 100: done (store)" in runs
    assert sum(line.endswith("to train, at the rate the tuning picks") for line in runs) == 21
    assert not (tmp_path / "out" / "runs").exists()  # nothing trained


def test_once_tuned_the_list_names_each_reported_run_at_its_best_rate(tmp_path, capsys):
    design = Design()
    best = {(batch, opt): LARS_RATES[1] if opt == "lars" else SGD_RATES[2] for batch, opt in rows.protocol_cells(design)}
    error = fake_errors(design, best)
    store = Store(tmp_path / "store.jsonl")
    for row in rows.protocol_tuning_rows(design):
        store.add({**provenance(), "row": row.key, "seed": 100, "val_error": error(row, 100),
                   "settings": settings_of(config(row, 100), design)})
    assert cli.main(["--parts", "6", "--list", "--output-dir", str(tmp_path / "out"), "--cache-dir",
                     str(tmp_path / "cache"), "--store", str(store.path)]) == 0
    out = capsys.readouterr().out
    assert "part 6, tuning on seed 100: 31 runs, 31 done" in out and out.endswith("part 6 in all: 52 runs, 31 done\n")
    for (batch, opt), rate in best.items():
        for seed in (0, 1, 2):
            assert f"  {protocol_row(batch, opt, rate).name}, seed {seed}: to train\n" in out


@pytest.mark.parametrize("flags,message", [
    (["--protocol-b-star", "96"], "--protocol-b-star 96 is not 32 times a power of two"),
    (["--protocol-b-star", "256"], "raise --train-per-class or lower --protocol-b-star"),
    (["--protocol-lars-rates", "1,1"], "--protocol-lars-rates 1,1 repeats a rate"),
    (["--protocol-sgd-rates", "0.1,0"], "--protocol-sgd-rates must be positive, got 0"),
    (["--tuning-seed", "1"], "--tuning-seed 1 is one of --seeds"),
    (["--list", "--parts", "6,2"], "--list lists parts 1 and 6"),
])
def test_bad_part_6_flags_get_one_line_and_exit_code_2(tmp_path, capsys, flags, message):
    base = ["--output-dir", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--seeds", "0,1",
            "--batch-seeds", "0,1", "--max-batch", "64", "--train-per-class", "52", "--parts", "6",
            "--protocol-b-star", "32"]
    assert cli.main(base + flags) == 2
    assert message in error_line(capsys)
    assert not (tmp_path / "out" / "runs").exists()


def test_part_6_is_checked_only_where_named():
    """The default parts keep their constraints: a design too small for part 6 still runs parts 1-5."""
    small = dataclasses.replace(Design(), train_per_class=52, max_batch=64, protocol_b_star=128)
    cli.check(small)  # nothing raised: part 6 is not among the default parts
    with pytest.raises(UserError, match="lower --protocol-b-star"):
        cli.check(small, parts=(1, 6))
