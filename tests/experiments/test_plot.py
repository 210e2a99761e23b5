"""python -m minidl.plot OUTDIR: PNGs from metrics.jsonl (+ steps.jsonl), one-line errors."""
import json
import subprocess
import sys

import pytest
from PIL import Image

from minidl import plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EPOCH_FIGURES = ["global_batch.png", "loss.png", "lr.png", "throughput.png", "top1.png"]


def write_lines(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def metrics_rows(epochs=4):
    return [{"epoch": e, "train_loss": 2.0 / e, "val_loss": 2.2 / e, "val_top1": 0.1 * e, "val_top5": 0.2 * e,
             "lr": 0.1 / e, "images_per_sec": 100.0 + e, "seconds": 3.0, "global_batch": 128 * e}
            for e in range(1, epochs + 1)]


def steps_rows(iterations=40, per_epoch=10):
    return [{"iteration": i, "epoch": i / per_epoch, "loss": 2.0 / (1 + i / per_epoch), "lr": 0.01 * i,
             "global_batch": 128, "img_per_s": 90.0, "data": 0.01, "forward": 0.05, "backward": 0.1,
             "allreduce": 0.02, "optimizer": 0.005} for i in range(1, iterations + 1)]


@pytest.fixture
def run_dir(tmp_path):
    write_lines(tmp_path / "metrics.jsonl", metrics_rows())
    write_lines(tmp_path / "steps.jsonl", steps_rows())
    return tmp_path


def assert_valid_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", path
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (700, 400), path
    with Image.open(path) as image:  # an independent decoder reads every chunk
        image.verify()


@pytest.mark.slow
def test_module_entry_point_writes_every_figure(run_dir):
    done = subprocess.run([sys.executable, "-m", "minidl.plot", str(run_dir)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    expected = sorted(EPOCH_FIGURES + ["time_split.png"])
    assert sorted(line.rsplit("/", 1)[-1] for line in done.stdout.splitlines()) == expected
    assert sorted(p.name for p in run_dir.glob("*.png")) == expected
    for name in expected:
        assert_valid_png(run_dir / name)


def test_without_steps_or_throughput_only_what_is_there_is_drawn(tmp_path):
    write_lines(tmp_path / "metrics.jsonl", [{k: v for k, v in row.items() if k != "images_per_sec"}
                                             for row in metrics_rows()])
    written = plot.plot_run(tmp_path)
    assert sorted(p.name for p in written) == ["global_batch.png", "loss.png", "lr.png", "top1.png"]


def test_time_splits_plot_the_phases_present(tmp_path):
    rows = [{k: v for k, v in row.items() if k not in ("allreduce", "lr")} for row in steps_rows()]
    write_lines(tmp_path / "steps.jsonl", rows)
    assert plot.time_split_figure(tmp_path / "t.png", plot.read_jsonl(tmp_path / "steps.jsonl", "iteration"))
    assert_valid_png(tmp_path / "t.png")
    assert plot.time_split_figure(tmp_path / "none.png", [{"iteration": 1, "epoch": 0.1}]) is None


def test_a_resumed_run_logged_twice_keeps_the_last_line_per_key(tmp_path):
    rows = steps_rows(6)
    again = [dict(row, loss=-1.0) for row in rows[3:]]  # resumed after iteration 3 and logged 4..6 again
    write_lines(tmp_path / "steps.jsonl", rows + again + [{"iteration": 7, "lr": 0.5}])
    read = plot.read_jsonl(tmp_path / "steps.jsonl", "iteration")
    assert [row["iteration"] for row in read] == [1, 2, 3, 4, 5, 6, 7]
    epochs, losses = plot.series(read, "loss")
    assert (epochs, losses) == ([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [rows[i]["loss"] for i in range(3)] + [-1.0] * 3)


def run_main(capsys, argv):
    code = plot.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("problem,words", [
    ("no_dir", ["is not a directory", "--output-dir"]),
    ("no_metrics", ["has no metrics.jsonl"]),
    ("empty_metrics", ["has no epochs yet"]),
    ("bad_json", ["metrics.jsonl line 3 is not JSON", "fix or delete"]),
    ("not_object", ["metrics.jsonl line 2 is not a JSON object with a numeric 'epoch'"]),
    ("bad_steps", ["steps.jsonl line 1 is not a JSON object with a numeric 'iteration'"]),
    ("bad_trace", ["trace.json is not a trace written by --trace-steps", "trace again"]),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, problem, words):
    rows = "".join(json.dumps(row) + "\n" for row in metrics_rows())
    contents = {"no_metrics": {}, "empty_metrics": {"metrics.jsonl": "\n"},
                "bad_json": {"metrics.jsonl": rows.replace('"epoch": 3,', '"epoch": 3')},
                "not_object": {"metrics.jsonl": rows.replace(json.dumps(metrics_rows()[1]), "[1, 2]")},
                "bad_steps": {"metrics.jsonl": rows, "steps.jsonl": '{"epoch": 0.1}\n'},
                "bad_trace": {"metrics.jsonl": rows, "trace.json": '{"traceEvents": [{"ph": "X"}]}'}}.get(problem, {})
    for name, text in contents.items():
        (tmp_path / name).write_text(text)
    target = tmp_path / "missing" if problem == "no_dir" else tmp_path
    code, out, err = run_main(capsys, [str(target)])
    assert (code, out) == (2, "") and err.count("\n") == 1 and err.startswith("minidl.plot: error: "), err
    for word in words:
        assert word in err, err
    assert not list(tmp_path.glob("*.png"))


def test_usage(capsys):
    code, _, err = run_main(capsys, [])
    assert code == 2 and err.startswith("usage: python -m minidl.plot OUTDIR")
    code, out, _ = run_main(capsys, ["--help"])
    assert code == 0 and "metrics.jsonl" in out


def test_per_rank_step_time_is_drawn_against_steps_for_several_ranks(tmp_path):
    rows = [dict(row, rank_compute=[0.1, 0.1 + 0.01 * row["iteration"], 0.2]) for row in steps_rows(5)]
    write_lines(tmp_path / "metrics.jsonl", metrics_rows())
    write_lines(tmp_path / "steps.jsonl", rows + [{"iteration": 6, "epoch": 0.6, "rank_compute": [0.1, "x", 0.2]}])
    assert plot.rank_series(plot.read_jsonl(tmp_path / "steps.jsonl", "iteration")) == [
        ([1, 2, 3, 4, 5], [100.0] * 5), ([1, 2, 3, 4, 5], [1e3 * (0.1 + 0.01 * i) for i in range(1, 6)]),
        ([1, 2, 3, 4, 5], [200.0] * 5)]
    assert "rank_step_time.png" in [p.name for p in plot.plot_run(tmp_path)]
    assert_valid_png(tmp_path / "rank_step_time.png")
    one_rank = tmp_path / "one"
    one_rank.mkdir()
    write_lines(one_rank / "metrics.jsonl", metrics_rows())
    write_lines(one_rank / "steps.jsonl", [dict(row, rank_compute=[0.1]) for row in steps_rows(3)])
    assert "rank_step_time.png" not in [p.name for p in plot.plot_run(one_rank)]
