"""`python -m minidl.experiments.warmup`: the shape of Goyal et al.'s warmup comparison, small.

Goyal et al. (2017, Table 1 and Fig. 2) train ResNet-50 with k·n = 256 and with k·n = 8k
(k workers of n = 32 images, linear scaling rule) for the same 90 epochs: with no warmup the
large batch loses accuracy, constant warmup (5 epochs at the small rate) is worse still
(25.88% error), gradual warmup matches the small batch (23.74% vs 23.60%).

Here the same four rows with a CIFAR-style ResNet on the embedded dataset's "hard" variant:
the reference batch is n = 32 at rate `--lr`, the large batch k·n with k simulated workers
(gradient accumulation over k micro-batches of n, each normalized by its own batch norm, as
per-worker BN would), the rate scaled by k, the same epochs and the same ÷10 steps (at 50%
and 75% of training) for every row. Each row runs once per seed; the table gives the final
validation error, mean ± std over seeds, and a plot the validation error per epoch. The
README gives the measured tables (the defaults, and --lr 0.05, where k·n = 256 runs at 0.4).
"""
import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from minidl.config import Config
from minidl.data import make_embedded_dataset
from minidl.fileio import write_json_atomic

REFERENCE_BATCH = 32  # n, images per (simulated) worker


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    workers: int               # k; the global batch is k·n
    warmup_method: str | None  # None: no warmup


def rows(workers):
    large = f"k·n = {workers * REFERENCE_BATCH}"
    return [Row(f"k·n = {REFERENCE_BATCH}, baseline", 1, None), Row(f"{large}, no warmup", workers, None),
            Row(f"{large}, constant warmup", workers, "constant"), Row(f"{large}, gradual warmup", workers, "linear")]


def config_for(row, seed, args, data, output_dir):
    steps = (args.epochs // 2, args.epochs * 3 // 4)
    return Config(data_path=str(data), model=args.model, batch_schedule=f"0:{row.workers * REFERENCE_BATCH}",
                  max_per_rank_batch=REFERENCE_BATCH, epochs=args.epochs, lr=args.lr, lr_base_batch=REFERENCE_BATCH,
                  lr_scheduler="step", lr_steps=steps, lr_gamma=0.1, momentum=0.9, weight_decay=5e-4,
                  norm_weight_decay=0.0, lr_warmup_epochs=args.warmup_epochs if row.warmup_method else 0.0,
                  lr_warmup_method=row.warmup_method or "linear", lr_warmup_start=args.lr,
                  train_crop_size=32, val_crop_size=32, val_resize_size=32, augment="cifar",
                  seed=seed, output_dir=str(output_dir), print_freq=50, cache_dir=args.cache_dir)


def run_row(row, seed, args, data):
    from minidl.trainer import run
    output_dir = Path(args.output_dir) / f"{row.workers}x{REFERENCE_BATCH}-{row.warmup_method or 'none'}-seed{seed}"
    metrics_path = output_dir / "metrics.jsonl"
    if not (output_dir / "summary.json").exists():  # a finished run is kept: rerunning resumes the experiment
        run(config_for(row, seed, args, data, output_dir))
    return [json.loads(line)["val_top1"] for line in metrics_path.read_text().splitlines()]


def summarize(results):
    """{row: (mean %, std %)} of the final validation error over seeds."""
    table = {}
    for name, runs in results.items():
        errors = [100 * (1 - curve[-1]) for curve in runs]
        table[name] = (statistics.mean(errors), statistics.stdev(errors) if len(errors) > 1 else 0.0)
    return table


def markdown(table, args):
    lines = [f"| {args.model}, {args.epochs} epochs, seeds {args.seeds} | val top-1 error (%) |", "|---|---|"]
    lines += [f"| {name} | {mean:.2f} ± {std:.2f} |" for name, (mean, std) in table.items()]
    return "\n".join(lines)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, runs in results.items():
        epochs = range(1, len(runs[0]) + 1)
        mean = [statistics.mean(100 * (1 - curve[e]) for curve in runs) for e in range(len(runs[0]))]
        axes.plot(epochs, mean, marker="o", markersize=3, label=name)
    axes.set(xlabel="epoch", ylabel="validation error (%)", title="Warmup at small scale (mean over seeds)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m minidl.experiments.warmup", description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default="runs/warmup")
    p.add_argument("--model", default="resnet20")
    p.add_argument("--epochs", type=int, default=16)
    p.add_argument("--workers", type=int, default=8, help="k, simulated workers of n = 32 images")
    p.add_argument("--lr", type=float, default=0.025, help="the rate for n = 32 images")
    p.add_argument("--warmup-epochs", type=float, default=2.0)
    p.add_argument("--seeds", default="0,1", help="comma-separated")
    p.add_argument("--train-per-class", type=int, default=600)
    p.add_argument("--val-per-class", type=int, default=100)
    p.add_argument("--cache-dir", default=Config().cache_dir)
    args = p.parse_args(argv)
    args.seed_list = [int(s) for s in args.seeds.split(",")]
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    data = make_embedded_dataset(Path(args.cache_dir) / f"embedded-hard-{args.train_per_class}",
                                 train_per_class=args.train_per_class, val_per_class=args.val_per_class,
                                 difficulty="hard")
    results = {row.name: [run_row(row, seed, args, data) for seed in args.seed_list] for row in rows(args.workers)}
    table = summarize(results)
    output = Path(args.output_dir)
    text = markdown(table, args)
    (output / "table.md").write_text(text + "\n")
    write_json_atomic(output / "results.json", {"args": vars(args), "curves": results, "table": table})
    plot(results, output / "curves.png")
    print(text)
    print(f"curves: {output / 'curves.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
