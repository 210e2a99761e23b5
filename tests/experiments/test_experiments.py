"""The large-minibatch study's plumbing on a tiny configuration: it runs end to end, writes its
table, figures and JSON, resumes from its cache without training again, computes B* as
defined and its bootstrap distribution as a hand count gives it, builds rows that differ only in
their knob, and refuses bad flags in one line."""
import dataclasses
import json

import pytest

import minidl.trainer
from minidl.experiments.large_batch import cli, report, rows
from minidl.experiments.large_batch.rows import Design, Row

PNG = b"\x89PNG\r\n\x1a\n"


def tiny(tmp_path, *extra):
    return ["--output-dir", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--seeds", "0,1",
            "--batch-seeds", "0,1,2",
            "--max-batch", "64", "--epochs", "2", "--warmup-epochs", "1", "--control-epoch", "1",
            "--train-per-class", "52", "--val-per-class", "2", "--image-size", "8", "--workers", "0",
            "--ls-train-per-class", "16", "--ls-seeds", "0,1", *extra]


def error_line(capsys):
    """The one line of the error on stderr (after whatever a progress bar drew)."""
    lines = [line for line in capsys.readouterr().err.split("\n") if "error:" in line]
    assert len(lines) == 1, lines
    return lines[0]


def counting_trainer(monkeypatch):
    calls, real = [], minidl.trainer.run
    monkeypatch.setattr(minidl.trainer, "run", lambda config: calls.append(config.output_dir) or real(config))
    return calls


@pytest.mark.slow  # about 40 tiny runs
def test_study_writes_its_outputs_then_resumes_from_its_cache(tmp_path, monkeypatch):
    calls = counting_trainer(monkeypatch)
    assert cli.main(tiny(tmp_path)) == 0
    out = tmp_path / "out"
    results = json.loads((out / "results.json").read_text())
    b_star = results["b_star"]
    assert list(results["parts"]) == ["batch", "warmup", "control", "lars", "noisy-batch", "smoothing"]
    batch_part, *main_parts, noisy_batch, smoothing = (part["rows"] for part in results["parts"].values())
    assert list(batch_part) == ["b32-gradual", "b64-gradual"]
    assert b_star == report.critical_batch([(int(key[1:].split("-")[0]), row["mean"], row["std"])
                                            for key, row in batch_part.items()])
    assert all([run["seed"] for run in row["runs"]] == [0, 1, 2] for row in batch_part.values())
    later = {key: row for part in main_parts for key, row in part.items()}
    assert all([run["seed"] for run in row["runs"]] == [0, 1] for row in later.values())
    assert [key for key in later if key.endswith("-lars")] == [f"b{m * b_star}-gradual-lars" for m in (2, 4, 8)]
    assert list(noisy_batch) == ["b32-gradual", "b64-gradual"] and results["noisy_b_star"] in (32, 64)
    assert list(results["b_star_by_seed_count"]) == ["2", "3"]  # resamples of 2 and 3 of the 3 seeds
    assert all(abs(sum(dist.values()) - 1) < 1e-9 for dist in results["b_star_by_seed_count"].values())
    assert len(calls) == len(set(calls)) == (2 * 3 + 2 * len(later.keys() - batch_part.keys())  # each run once
                                             + 2 * len(noisy_batch) + 2 * len(smoothing.keys() - noisy_batch.keys()))
    for folder, part in (("runs", {**batch_part, **later}), ("label-noise/runs", {**noisy_batch, **smoothing})):
        for key, row in part.items():  # the steps reported are the steps the trainer took
            assert (out / folder / f"{key}-seed0" / f"checkpoint-e002-i{row['steps']:08d}.h5").exists(), key
    table = (out / "table.md").read_text()
    for text in ("Part 1", f"B* = {b_star}", "Part 2", "Part 3", "k·n = 32", f"k·n = {2 * b_star}, no warmup",
                 f"k·n = {b_star} → {2 * b_star} at epoch 1", "label smoothing 0.1", "Part 4", "LARS", "P(B* = 64)",
                 "Part 5a", "40% of training labels flipped", "Part 5b", "in pooled std"):
        assert text in table
    for name in ("error-vs-batch.png", "warmup.png", "control.png", "lars.png"):
        assert (out / name).read_bytes()[:8] == PNG

    calls.clear()
    (out / "table.md").unlink()
    assert cli.main(tiny(tmp_path)) == 0  # everything from the cache: nothing trains
    assert calls == [] and (out / "table.md").read_text() == table

    (out / "runs" / "b64-gradual-seed1" / "result.json").unlink()  # as if stopped after its last epoch
    assert cli.main(tiny(tmp_path)) == 0
    assert calls == [str(out / "runs" / "b64-gradual-seed1")]
    assert json.loads((out / "results.json").read_text())["parts"] == results["parts"]

    calls.clear()
    assert cli.main(tiny(tmp_path, "--parts", "4")) == 0 and calls == []  # part 1 and the LARS part, cached
    selected = json.loads((out / "results.json").read_text())
    assert list(selected["parts"]) == ["batch", "lars"] and selected["parts"]["lars"] == results["parts"]["lars"]
    assert "noisy_b_star" not in selected and selected["lars_b_star"] == results["lars_b_star"]


def test_a_cached_run_made_with_other_settings_is_refused(tmp_path, capsys):
    assert cli.main(tiny(tmp_path, "--lr-sweep", "0.1", "--seeds", "0")) == 0
    assert "lowest error at η = 0.1" in capsys.readouterr().out
    assert cli.main(tiny(tmp_path, "--lr-sweep", "0.1", "--seeds", "0", "--wd", "0")) == 2
    error = error_line(capsys)
    assert "other settings (weight_decay)" in error and "--output-dir" in error


def test_a_cached_run_from_before_a_new_engine_setting_is_used_only_at_its_default(tmp_path, capsys):
    flags = tiny(tmp_path, "--lr-sweep", "0.1", "--seeds", "0")
    assert cli.main(flags) == 0
    result_path = tmp_path / "out" / "lr-sweep" / "lr0.1" / "runs" / "b32-gradual-seed0" / "result.json"
    result = json.loads(result_path.read_text())
    assert result["settings"].pop("fuse") is False  # the record of a run made before --fuse existed
    result_path.write_text(json.dumps(result))
    assert cli.main(flags) == 0 and "lowest error at η = 0.1" in capsys.readouterr().out
    assert result["settings"]["opt"] == "sgd"
    result["settings"]["opt"] = None  # left unset: the engine fills in SGD, what the study now gives
    result_path.write_text(json.dumps(result))
    assert cli.main(flags) == 0 and "lowest error at η = 0.1" in capsys.readouterr().out
    result["settings"]["retired_setting"] = 0.5  # a setting of the record the engine no longer has
    result_path.write_text(json.dumps(result))
    assert cli.main(flags) == 2 and "other settings (retired_setting)" in error_line(capsys)
    del result["settings"]["retired_setting"], result["settings"]["bn_group_size"]  # a new setting, not at its default
    result_path.write_text(json.dumps(result))
    assert cli.main(flags) == 2 and "other settings (bn_group_size)" in error_line(capsys)


def test_critical_batch_is_the_largest_within_one_std_of_the_small_batch():
    # 32: 5.0 ± 0.5, so the bound is 5.5 (inclusive); 256 exceeds it, and 512's mean under it does not count
    points = [(64, 5.3, 0.9), (32, 5.0, 0.5), (128, 5.5, 0.1), (256, 5.6, 0.2), (512, 5.4, 2.0), (1024, 9.0, 0.3)]
    assert report.critical_batch(points) == 128
    assert report.critical_batch([(32, 5.0, 0.0), (64, 5.01, 0.0)]) == 32
    assert report.critical_batch([(32, 5.0, 1.0), (64, 3.0, 0.1), (128, 6.5, 0.1)]) == 64  # better counts as within


def test_b_star_distribution_counts_resamples_as_a_hand_count_does():
    # two seeds: 32 errs 1 or 3, 64 errs 2 both times. Resampling both seeds: (0,0) gives 32 at 1 ± 0,
    # 64 above it; (1,1) 3 ± 0 and (0,1), (1,0) 2 ± 1.41 leave 64 within: B* = 32 in a quarter of the draws
    errors = {32: [1.0, 3.0], 64: [2.0, 2.0]}
    assert abs(report.b_star_distribution(errors, 2)[32] - 0.25) < 0.03  # 2,000 draws: binomial std 0.01
    assert abs(report.b_star_distribution(errors, 1)[32] - 0.5) < 0.04  # one seed: no spread, 32 iff seed 0
    assert report.b_star_distribution({32: [3.0, 3.1], 64: [2.0, 2.1], 128: [9.0, 9.5]}, 2) == {32: 0, 64: 1, 128: 0}
    assert report.b_star_distribution(errors, 2) == report.b_star_distribution(errors, 2)  # a fixed generator


def test_difference_in_pooled_standard_deviations():
    base = report.Stats(2.0, 0.3, (), ())
    delta, effect = report.difference(base, report.Stats(1.5, 0.4, (), ()))
    assert delta == -0.5 and abs(effect - (-0.5 / 0.125 ** 0.5)) < 1e-12


def config(row, seed=0, design=Design()):
    return rows.config_for(row, seed, design, "data", "out").to_dict()


def changed(a, b):
    return {k for k in a if a[k] != b[k]}


def test_rows_differ_only_in_their_knob():
    gradual, none, constant = Row(256), Row(256, "none"), Row(256, "constant")
    assert changed(config(gradual), config(Row(512))) == {"batch_schedule"}
    assert changed(config(gradual), config(none)) == {"lr_warmup_epochs"}
    assert changed(config(gradual), config(constant)) == {"lr_warmup_method"}
    assert changed(config(Row(512)), config(Row(256, doubles_at=3))) == {"batch_schedule"}
    assert changed(config(Row(1024)), config(Row(1024, label_smoothing=0.1))) == {"label_smoothing"}
    assert changed(config(gradual), config(gradual, seed=1)) == {"seed"}
    assert config(Row(256, doubles_at=3))["batch_schedule"] == "0:256,3:512"
    assert (config(none)["lr_warmup_epochs"], config(gradual)["lr_warmup_epochs"]) == (0.0, 2.0)
    assert config(constant)["lr_warmup_start"] == config(gradual)["lr"] == Design().lr  # from η per 32
    assert {config(Row(b))["bn_group_size"] for b in (32, 1024)} == {32}
    assert changed(config(Row(512)), config(Row(512, opt="lars"))) == {"opt", "lr", "lr_warmup_start"}
    assert config(Row(512, opt="lars"))["lr"] == config(Row(512, opt="lars"))["lr_warmup_start"] == Design().lars_lr
    assert Row(512, opt="lars").key == "b512-gradual-lars" and Row(512).key == "b512-gradual"


def test_the_noisy_design_changes_only_its_data_and_rate():
    design = dataclasses.replace(Design(), ls_lr=0.1)
    noisy = design.noisy()
    assert changed(config(Row(64), design=design), config(Row(64), design=noisy)) == {"lr", "lr_warmup_start"}
    assert config(Row(64), design=noisy)["lr"] == 0.1
    assert (noisy.label_noise, noisy.train_per_class) == (design.ls_label_noise, design.ls_train_per_class)
    assert noisy.dataset_name == design.dataset_name.replace("2000x10", "1000x10") + "-noise0.4"


def test_study_rows_follow_b_star():
    design = dataclasses.replace(Design(), max_batch=512, control_epoch=3)
    assert [row.batch for row in rows.batch_rows(design)] == [32, 64, 128, 256, 512]
    assert rows.warmup_rows(128) == [Row(32), Row(128, "none"), Row(128, "constant"), Row(128),
                                     Row(256, "none"), Row(256, "constant"), Row(256)]
    assert rows.warmup_rows(32) == [Row(32), Row(64, "none"), Row(64, "constant"), Row(64)]
    assert rows.control_rows(128, design) == [Row(128), Row(256), Row(128, doubles_at=3), Row(512),
                                              Row(512, label_smoothing=0.1)]
    assert Row(128, doubles_at=3).steps(design) == 3 * (20000 // 128) + 7 * (20000 // 256)
    assert rows.lars_rows(128) == [Row(b, opt=opt) for b in (256, 512, 1024) for opt in ("sgd", "lars")]
    assert rows.smoothing_rows(64, design) == [Row(64), Row(64, label_smoothing=0.1), Row(128),
                                               Row(128, label_smoothing=0.1)]


@pytest.mark.parametrize("flags,message", [
    (["--max-batch", "100"], "--max-batch 100 is not 32 times a power of two"),
    (["--seeds", "0"], "--seeds 0: the study needs at least two seeds"),
    (["--batch-seeds", "1,1"], "--batch-seeds 1,1 repeats a seed"),
    (["--seeds", "0,x"], "not a comma-separated list of ints"),
    (["--micro-batch", "48"], "--micro-batch 48"),
    (["--control-epoch", "2"], "--control-epoch 2 is not inside the 2 epochs"),
    (["--max-batch", "256"], "raise --train-per-class or lower --max-batch"),
    (["--model", "resnet9"], "unknown --model 'resnet9'"),
    (["--device", "tpu"], "invalid choice: 'tpu'"),
    (["--lr-sweep", "0.1,-1"], "--lr-sweep must be positive, got -1"),
    (["--lr", "nan"], "--lr must be positive, got nan"),
    (["--epochs", "1", "--warmup-epochs", "0"], "--epochs 1: the study needs at least 2"),
    (["--wd", "-1"], "--weight-decay must be >= 0"),  # the engine's checks, before any run
    (["--label-smoothing", "1.5"], "--label-smoothing must be in [0, 1)"),  # only part 3 trains with it
    (["--ls-label-noise", "1"], "--ls-label-noise 1 is not a fraction in [0, 1)"),
    (["--ls-seeds", "3,3"], "--ls-seeds 3,3 repeats a seed"),
    (["--lars-lr", "0"], "--lars-lr must be positive, got 0"),
    (["--lr-sweep", "0.1", "--tune-batch", "48"], "--tune-batch 48 is not 32·2^j"),
    (["--parts", "1,7"], "--parts 1,7: the study's parts are 1 to 6"),
    (["--ls-train-per-class", "4"], "raise --ls-train-per-class or lower --max-batch"),
])
def test_bad_flags_get_one_line_and_exit_code_2(tmp_path, capsys, flags, message):
    assert cli.main(tiny(tmp_path, *flags)) == 2
    assert message in error_line(capsys)
    assert not (tmp_path / "out" / "runs").exists()  # nothing started


def test_the_lars_rate_sweep_trains_lars_and_names_its_flag(tmp_path, capsys):
    assert cli.main(tiny(tmp_path, "--lr-sweep", "0.1", "--seeds", "0", "--tune", "lars")) == 0
    assert "run the study with --lars-lr 0.1" in capsys.readouterr().out
    settings = json.loads((tmp_path / "out" / "lr-sweep" / "lars-lr0.1" / "runs" / "b32-gradual-lars-seed0" /
                           "result.json").read_text())["settings"]
    assert (settings["opt"], settings["lr"]) == ("lars", 0.1)


def test_a_refused_run_leaves_nothing_that_blocks_the_corrected_one(tmp_path, capsys):
    sweep = tiny(tmp_path, "--lr-sweep", "0.1", "--seeds", "0")
    assert cli.main(sweep + ["--wd", "-1"]) == 2
    assert cli.main(sweep) == 0 and "lowest error at η = 0.1" in capsys.readouterr().out


def test_an_output_dir_that_is_a_file_gets_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert cli.main(tiny(tmp_path, "--output-dir", str(tmp_path / "file"))) == 2
    error = error_line(capsys)
    assert "--output-dir" in error and "is a file: choose a folder you can write to" in error
