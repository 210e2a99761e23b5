"""Checkpoints in the training loop: exact resume after a stop or a kill (1 and 4 ranks),
preemption by SIGTERM, a truncated checkpoint, a non-finite loss, a dead rank, another world size
(mid-epoch: test_resume_world_size.py)."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from minidl.checkpoint import load_checkpoint
from minidl.data import make_embedded_dataset
from mpi.launch import mpiexec, require_mpi

pytestmark = pytest.mark.slow  # every test trains in child processes, some under mpiexec

REPO = Path(__file__).resolve().parents[2]
DETERMINISTIC = ("epoch", "train_loss", "val_loss", "val_top1", "val_top5", "lr", "global_batch")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_embedded_dataset(tmp_path_factory.mktemp("embedded") / "data", train_per_class=16, val_per_class=4)


def command(data, output_dir, *extra, ranks=1, batch=16, epochs=4):
    """train.py on the small dataset (10 steps of 16 images per epoch), as argv."""
    flags = ["--data-path", data, "--model", "resnet20", "--epochs", epochs, "--lr", 0.05, "--lr-base-batch", 16,
             "--train-crop-size", 32, "--val-crop-size", 32, "--val-resize-size", 32, "--augment", "cifar",
             "--print-freq", 1, "--output-dir", output_dir, *extra]
    flags = ["-b", batch // ranks, *flags] if "--batch-schedule" not in extra else flags
    python = [sys.executable, "-m", "mpi4py"] if ranks > 1 else [sys.executable]
    launcher = [mpiexec(), "-n", str(ranks)] if ranks > 1 else []
    return launcher + python + [str(REPO / "train.py")] + [str(flag) for flag in flags]


def environment():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIDL_")}
    env.update(MINIDL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MINIDL_DEVICE="cpu")
    return env


def train(argv, timeout=300):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=environment())


def start(argv):
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(),
                            start_new_session=True)


def wait_for(condition, process, timeout=120):
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the run ended early:\n{process.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.05)


def iterations_logged(output_dir):
    path = Path(output_dir) / "steps.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def final_state(output_dir):
    """(parameters, momentum, every rank's BN statistics, the deterministic metrics) at the end."""
    checkpoints = sorted(Path(output_dir).glob("checkpoint-e*-i*.h5"))
    arrays, meta = load_checkpoint(checkpoints[-1])
    metrics = [{k: m[k] for k in DETERMINISTIC} for m in map(json.loads, (Path(output_dir) / "metrics.jsonl").open())]
    return arrays, meta, metrics


def assert_same_run(resumed_dir, reference_dir):
    ours, our_meta, our_metrics = final_state(resumed_dir)
    theirs, their_meta, their_metrics = final_state(reference_dir)
    assert our_meta["iteration"] == their_meta["iteration"]
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    assert our_metrics == their_metrics


@pytest.fixture(scope="module")
def reference_one_rank(data, tmp_path_factory):
    output = tmp_path_factory.mktemp("reference1")
    result = train(command(data, output, "--checkpoint-every", 3))
    assert result.returncode == 0, result.stderr[-2000:]
    return output


def test_sigterm_mid_epoch_checkpoints_and_the_resumed_run_is_the_same(data, tmp_path, reference_one_rank):
    process = start(command(data, tmp_path, "--checkpoint-every", 3))
    wait_for(lambda: iterations_logged(tmp_path) >= 14, process)  # inside the second epoch
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
    assert "stopped by SIGTERM" in out and "--resume auto" in out
    result = train(command(data, tmp_path, "--checkpoint-every", 3, "--resume", "auto"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resumed from" in result.stdout
    assert_same_run(tmp_path, reference_one_rank)


def test_killed_run_resumes_from_its_last_periodic_checkpoint(data, tmp_path, reference_one_rank):
    process = start(command(data, tmp_path, "--checkpoint-every", 3))
    wait_for(lambda: len(list(tmp_path.glob("checkpoint-e001-*.h5"))) >= 1, process)  # inside the second epoch
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    result = train(command(data, tmp_path, "--checkpoint-every", 3, "--resume", "auto"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert_same_run(tmp_path, reference_one_rank)


def test_four_ranks_preempted_mid_epoch_resume_exactly(data, tmp_path_factory):
    require_mpi()
    reference, resumed = tmp_path_factory.mktemp("reference4"), tmp_path_factory.mktemp("resumed4")
    result = train(command(data, reference, "--checkpoint-every", 4, ranks=4))
    assert result.returncode == 0, result.stderr[-2000:]
    process = start(command(data, resumed, "--checkpoint-every", 4, ranks=4))
    wait_for(lambda: iterations_logged(resumed) >= 13, process)
    process.send_signal(signal.SIGTERM)  # to mpiexec, which passes it on to every rank
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
    result = train(command(data, resumed, "--checkpoint-every", 4, "--resume", "auto", ranks=4))
    assert result.returncode == 0, result.stderr[-2000:]
    assert_same_run(resumed, reference)
    arrays, meta, _ = final_state(resumed)
    assert meta["world_size"] == 4 and {f"rank3/bn1.running_mean", "rank0/bn1.running_mean"} <= set(arrays)


def test_truncated_checkpoint_is_refused_in_one_line_and_left_alone(data, tmp_path, reference_one_rank):
    newest = sorted(reference_one_rank.glob("checkpoint-e*-i*.h5"))[-1]
    broken = tmp_path / newest.name
    broken.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    digest = hashlib.sha256(broken.read_bytes()).hexdigest()
    result = train(command(data, tmp_path / "out", "--resume", broken))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and str(broken) in result.stderr, result.stderr
    assert hashlib.sha256(broken.read_bytes()).hexdigest() == digest


def test_resume_auto_skips_a_truncated_newest_checkpoint(data, tmp_path, reference_one_rank):
    for path in reference_one_rank.glob("checkpoint-*.h5"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    newest = sorted(tmp_path.glob("checkpoint-e*-i*.h5"))[-1]
    newest.write_bytes(newest.read_bytes()[:1000])
    result = train(command(data, tmp_path, "--resume", "auto", "--epochs", 5))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "skipped: trying an older one" in result.stderr and "resumed from" in result.stdout


def test_checkpoint_of_another_model_is_refused(data, tmp_path, reference_one_rank):
    newest = sorted(reference_one_rank.glob("checkpoint-e*-i*.h5"))[-1]
    argv = command(data, tmp_path, "--resume", newest)
    argv[argv.index("resnet20")] = "resnet32"
    result = train(argv)
    assert result.returncode == 2 and "resnet20" in result.stderr and "resnet32" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_non_finite_loss_stops_with_a_diagnostic_checkpoint_beside_the_good_ones(data, tmp_path):
    argv = command(data, tmp_path, "--checkpoint-every", 2, "--lr-scheduler", "step", "--lr-steps", "1",
                   "--lr-gamma", "1")
    argv[argv.index("--lr") + 1] = "1e9"  # diverges within a few steps
    result = train(argv)
    assert result.returncode == 1, result.stderr[-2000:]
    message = result.stderr.strip().splitlines()[-1]
    assert "non-finite loss at iteration" in message and "checkpoint-nonfinite-i" in message
    assert len(list(tmp_path.glob("checkpoint-nonfinite-i*.h5"))) == 1
    for path in tmp_path.glob("checkpoint-e*-i*.h5"):  # the regular ones still load
        load_checkpoint(path)


def test_a_dead_rank_ends_the_job_quickly_and_is_named(data, tmp_path):
    require_mpi()
    process = start(command(data, tmp_path, ranks=4, epochs=20))
    wait_for(lambda: iterations_logged(tmp_path) >= 2, process)
    victim = json.loads((tmp_path / "ranks.json").read_text())[2]["pid"]
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    out, err = process.communicate(timeout=60)
    assert time.monotonic() - killed < 30
    assert process.returncode != 0
    notes = [line for line in err.splitlines() if "died without finishing" in line]
    assert notes and notes[0].startswith(f"minidl: rank 2 of 4 (pid {victim} "), err[-3000:]


def test_resume_on_another_world_size_keeps_the_global_batch(data, tmp_path):
    require_mpi()
    result = train(command(data, tmp_path, epochs=1))
    assert result.returncode == 0, result.stderr[-2000:]
    result = train(command(data, tmp_path, "--resume", "auto", ranks=2, epochs=2))
    assert result.returncode == 0, result.stderr[-2000:]
    _, meta, metrics = final_state(tmp_path)
    assert meta["world_size"] == 2 and [m["global_batch"] for m in metrics] == [16, 16]


def test_resume_on_ranks_that_cannot_split_the_global_batch_names_those_that_can(data, tmp_path):
    require_mpi()
    process = start(command(data, tmp_path, "--checkpoint-every", 2))
    wait_for(lambda: len(list(tmp_path.glob("checkpoint-e000-*.h5"))) >= 1, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    result = train(command(data, tmp_path, "--resume", "auto", ranks=3))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "does not split over 3 ranks: resume with 1, 2, 4, 8 or 16 processes" in result.stderr, result.stderr


def test_resuming_a_finished_run_says_so_and_changes_nothing(data, tmp_path, reference_one_rank):
    shutil.copytree(reference_one_rank, tmp_path, dirs_exist_ok=True)
    before = (tmp_path / "metrics.jsonl").read_text()
    result = train(command(data, tmp_path, "--resume", "auto"))
    assert result.returncode == 0 and "has finished its 4 epochs" in result.stdout
    assert (tmp_path / "metrics.jsonl").read_text() == before
