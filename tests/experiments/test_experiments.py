"""The large-minibatch study's plumbing on a tiny configuration: it runs end to end, writes its
table, figures and JSON, resumes from its cache without training again, computes B* as
defined, builds rows that differ only in their knob, and refuses bad flags in one line."""
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
            "--train-per-class", "16", "--val-per-class", "2", "--image-size", "8", "--workers", "0", *extra]


def error_line(capsys):
    """The one line of the error on stderr (after whatever a progress bar drew)."""
    lines = [line for line in capsys.readouterr().err.split("\n") if "error:" in line]
    assert len(lines) == 1, lines
    return lines[0]


def counting_trainer(monkeypatch):
    calls, real = [], minidl.trainer.run
    monkeypatch.setattr(minidl.trainer, "run", lambda config: calls.append(config.output_dir) or real(config))
    return calls


def test_study_writes_its_outputs_then_resumes_from_its_cache(tmp_path, monkeypatch):
    calls = counting_trainer(monkeypatch)
    assert cli.main(tiny(tmp_path)) == 0
    out = tmp_path / "out"
    results = json.loads((out / "results.json").read_text())
    b_star = results["b_star"]
    assert list(results["parts"]) == ["batch", "warmup", "control"]
    batch_part, *later_parts = (part["rows"] for part in results["parts"].values())
    assert list(batch_part) == ["b32-gradual", "b64-gradual"]
    assert b_star == report.critical_batch([(int(key[1:].split("-")[0]), row["mean"], row["std"])
                                            for key, row in batch_part.items()])
    assert all([run["seed"] for run in row["runs"]] == [0, 1, 2] for row in batch_part.values())
    later = {key: row for part in later_parts for key, row in part.items()}
    assert all([run["seed"] for run in row["runs"]] == [0, 1] for row in later.values())
    assert len(calls) == len(set(calls)) == 2 * 3 + 2 * len(later.keys() - batch_part.keys())  # each run once
    for key, row in {**batch_part, **later}.items():  # the steps reported are the steps the trainer took
        assert (out / "runs" / f"{key}-seed0" / f"checkpoint-e002-i{row['steps']:08d}.h5").exists(), key
    table = (out / "table.md").read_text()
    for text in ("Part 1", f"B* = {b_star}", "Part 2", "Part 3", "k·n = 32", f"k·n = {2 * b_star}, no warmup",
                 f"k·n = {b_star} → {2 * b_star} at epoch 1", "label smoothing 0.1"):
        assert text in table
    for name in ("error-vs-batch.png", "warmup.png", "control.png"):
        assert (out / name).read_bytes()[:8] == PNG

    calls.clear()
    (out / "table.md").unlink()
    assert cli.main(tiny(tmp_path)) == 0  # everything from the cache: nothing trains
    assert calls == [] and (out / "table.md").read_text() == table

    (out / "runs" / "b64-gradual-seed1" / "result.json").unlink()  # as if stopped after its last epoch
    assert cli.main(tiny(tmp_path)) == 0
    assert calls == [str(out / "runs" / "b64-gradual-seed1")]
    assert json.loads((out / "results.json").read_text())["parts"] == results["parts"]


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


def test_study_rows_follow_b_star():
    design = dataclasses.replace(Design(), max_batch=512, control_epoch=3)
    assert [row.batch for row in rows.batch_rows(design)] == [32, 64, 128, 256, 512]
    assert rows.warmup_rows(128) == [Row(32), Row(128, "none"), Row(128, "constant"), Row(128),
                                     Row(256, "none"), Row(256, "constant"), Row(256)]
    assert rows.warmup_rows(32) == [Row(32), Row(64, "none"), Row(64, "constant"), Row(64)]
    assert rows.control_rows(128, design) == [Row(128), Row(256), Row(128, doubles_at=3), Row(512),
                                              Row(512, label_smoothing=0.1)]
    assert Row(128, doubles_at=3).steps(design) == 3 * (20000 // 128) + 7 * (20000 // 256)


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
])
def test_bad_flags_get_one_line_and_exit_code_2(tmp_path, capsys, flags, message):
    assert cli.main(tiny(tmp_path, *flags)) == 2
    assert message in error_line(capsys)
    assert not (tmp_path / "out" / "runs").exists()  # nothing started


def test_a_refused_run_leaves_nothing_that_blocks_the_corrected_one(tmp_path, capsys):
    sweep = tiny(tmp_path, "--lr-sweep", "0.1", "--seeds", "0")
    assert cli.main(sweep + ["--wd", "-1"]) == 2
    assert cli.main(sweep) == 0 and "lowest error at η = 0.1" in capsys.readouterr().out


def test_an_output_dir_that_is_a_file_gets_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert cli.main(tiny(tmp_path, "--output-dir", str(tmp_path / "file"))) == 2
    error = error_line(capsys)
    assert "--output-dir" in error and "is a file: choose a folder you can write to" in error
