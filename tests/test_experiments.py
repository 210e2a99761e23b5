"""The warmup experiment runs end to end on a tiny configuration and writes its table and plot."""
import json

from minidl.experiments import warmup


def test_warmup_experiment_writes_table_results_and_plot(tmp_path):
    out = tmp_path / "out"
    assert warmup.main(["--epochs", "2", "--workers", "2", "--seeds", "0,1", "--train-per-class", "8",
                        "--val-per-class", "2", "--warmup-epochs", "1", "--output-dir", str(out),
                        "--cache-dir", str(tmp_path / "cache")]) == 0
    table = (out / "table.md").read_text()
    for row in ("k·n = 32, baseline", "k·n = 64, no warmup", "k·n = 64, constant warmup", "k·n = 64, gradual warmup"):
        assert row in table
    results = json.loads((out / "results.json").read_text())
    assert all(len(runs) == 2 and all(len(curve) == 2 for curve in runs) for runs in results["curves"].values())
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the rows differ only where they should: same data, same seeds, one knob each
    configs = {row.name: warmup.config_for(row, 0, warmup.parse_args([]), "d", tmp_path) for row in warmup.rows(16)}
    baseline, none, constant, gradual = configs.values()
    assert (baseline.batch_schedule, none.batch_schedule) == ("0:32", "0:512")
    assert none.lr_warmup_epochs == 0 and constant.lr_warmup_method == "constant"
    assert gradual.lr_warmup_method == "linear" and gradual.lr_warmup_epochs == constant.lr_warmup_epochs > 0
