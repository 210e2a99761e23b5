"""What a run leaves in --output-dir and shows on the terminal. Rank 0 only: on the other ranks
every method does nothing (the progress bar is disabled).

The files: config.json, ranks.json, metrics.jsonl (one object per epoch), steps.jsonl (every
--print-freq steps), autotune.json (on a GPU) and summary.json. A resumed run keeps the log
lines up to its resume point and rewrites what came after.

Details: docs/training.md, "minidl/training/outputs.py".
"""
import json
from pathlib import Path

from tqdm import tqdm

from minidl.backend import xp
from minidl.fileio import append_json_line, writable, write_bytes_atomic, write_json_atomic
from minidl.training.timer import PHASES


def check_writable(config):
    """A UserError naming the flag where a path the run writes to cannot be written: asked on
    rank 0 before any work, so a mistyped path costs nothing."""
    writable("--output-dir", config.output_dir, folder=True)
    if config.trace_steps:
        writable("--trace", config.trace_path)
    if not config.data_path:  # the embedded dataset is made there
        writable("--cache-dir", config.cache_dir, folder=True)


def keep_log_lines(path, keep):
    """Drop the lines of a JSON-lines log that `keep(record)` rejects (a resumed run rewrites them)."""
    if path.exists():
        lines = [line for line in path.read_text().splitlines() if line and keep(json.loads(line))]
        write_bytes_atomic(path, "".join(line + "\n" for line in lines).encode())


def summary_line(metrics, epochs):
    line = (f"epoch {metrics['epoch']}/{epochs}  train loss {metrics['train_loss']:.4f}  "
            f"val loss {metrics['val_loss']:.4f}  top1 {100 * metrics['val_top1']:.2f}%  "
            f"top5 {100 * metrics['val_top5']:.2f}%  lr {metrics['lr']:.4g}  "
            f"batch {metrics['global_batch']}  {metrics['images_per_sec']:.0f} img/s  {metrics['seconds']:.1f} s")
    if "communication_seconds" in metrics:
        line += (f"  all-reduce {1e3 * metrics['communication_seconds']:.0f} ms/step, "
                 f"{1e3 * metrics['allreduce_seconds']:.0f} ms exposed")
    if metrics.get("straggler") is not None:
        rank = metrics["straggler"]
        line += (f"  straggler: rank {rank}, >= 20% slower than the others' median in "
                 f"{100 * metrics['straggler_share']:.0f}% of steps ({1e3 * metrics['rank_compute'][rank]:.0f} ms "
                 f"against a median {1e3 * metrics['compute_median']:.0f} ms; the others waited "
                 f"{1e3 * metrics['straggler_wait']:.0f} ms/step)")
    skipped = metrics["train_skipped"] + metrics["val_skipped"]
    return line + (f"  ({skipped} undecodable images skipped)" if skipped else "")


class RunOutputs:
    def __init__(self, output_dir, is_root):
        self.dir, self.is_root = Path(output_dir), is_root
        self.metrics_path, self.steps_path = self.dir / "metrics.jsonl", self.dir / "steps.jsonl"
        self.summary_path = self.dir / "summary.json"
        self._tuning_told = False

    def notice(self, message):
        if self.is_root:
            print(f"minidl: {message}", flush=True)

    def start(self, record, ranks, position):
        """config.json (`record`), ranks.json, and the logs cut back to `position`."""
        if not self.is_root:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.dir / "config.json", record)
        write_json_atomic(self.dir / "ranks.json", ranks)
        keep_log_lines(self.metrics_path, lambda m: m["epoch"] <= position.epoch)
        keep_log_lines(self.steps_path, lambda s: s["iteration"] <= position.iteration)

    def banner(self, config, model_size, data, ranks, resumed):
        """What the run is: its settings, model, data, processes; `resumed`: (checkpoint, Position) or None."""
        if not self.is_root:
            return
        print(f"minidl: config {config.to_json()}")
        print(f"minidl: training {config.model} ({model_size}) on {data}, {config.epochs} epochs, "
              f"{len(ranks)} process{'es' if len(ranks) > 1 else ''}, {xp.__name__}")
        if len(ranks) > 1:
            print("minidl: ranks (rank:host:pid) " + " ".join(f"{r['rank']}:{r['host']}:{r['pid']}" for r in ranks))
        if resumed:
            path, p = resumed
            print(f"minidl: resumed from {path} at epoch {p.epoch + 1}, step {p.step}, iteration {p.iteration}")

    def progress_bar(self, epoch, epochs, steps, done):
        return tqdm(total=steps, initial=done, desc=f"epoch {epoch + 1}/{epochs}", unit="step", leave=False,
                    dynamic_ncols=True, disable=not self.is_root)

    def steps(self, bar, record):
        """A steps.jsonl line and the progress bar's status: loss, rate, img/s, the time split."""
        if not self.is_root:
            return
        append_json_line(self.steps_path, record)
        times = "/".join(f"{1e3 * record[phase]:.0f}" for phase in PHASES)
        communication = f", all-reduce {1e3 * record['communication']:.0f} ms" if "communication" in record else ""
        bar.set_postfix_str(f"loss {record['loss']:.4f}, lr {record['lr']:.4g}, {record['img_per_s']:.0f} img/s, "
                            f"ms {'/'.join(PHASES)} {times}{communication}")

    def epoch(self, metrics, epochs):
        if self.is_root:
            append_json_line(self.metrics_path, metrics)
            print(summary_line(metrics, epochs), flush=True)

    def tuning(self, report):
        """autotune.json (the validation, the convolution plans chosen so far, and the candidates
        behind new ones), and once, the first time shapes were tuned, a line saying how many, how
        long it took and how many kernel plans are not used."""
        if not self.is_root or report is None:
            return
        write_json_atomic(self.dir / "autotune.json", report)
        if report["tuned"] and not self._tuning_told:
            self._tuning_told = True
            failed = sum(record["status"] != "ok" for record in report["plans"].values())
            print(f"minidl: autotuned {report['tuned']} convolution shapes in {report['seconds']:.1f} s "
                  f"({failed} kernel plans failed or disagreed with v1, not used; cache {report['cache'] or 'none'}); "
                  f"the choices are in {self.dir / 'autotune.json'}", flush=True)

    def summary(self, summary):
        if self.is_root:
            write_json_atomic(self.summary_path, summary)
            print(f"minidl: done in {summary['wall_time']:.1f} s, val top-1 {100 * summary['val_top1']:.2f}%; "
                  f"metrics in {self.metrics_path}")

    def finished_summary(self):
        """The summary of a run that has finished already ({} where it has none)."""
        return json.loads(self.summary_path.read_text()) if self.summary_path.exists() else {}
