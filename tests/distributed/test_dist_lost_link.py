"""A lost network link: 2 hosts × 2 ranks train (tests/mpi/hosts.py) and one host is cut off mid-epoch
(its link taken down at the bridge). The surviving side names the unreachable ranks with their host,
the step and the operation; the job ends non-zero within --collective-timeout + 30 s, the cut-off
ranks end by themselves too; the newest checkpoint loads, and --resume auto on the surviving host's
two ranks finishes the epoch on the same data: the steps the cut lost are read again with the same
images, and across the interruption the epoch reads every training image once.

Which images each step reads is observed from outside the engine (tests/training/read_probe.py,
with --workers 0: a rank reads an image only for the batch it is about to train on)."""
import json
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from minidl.checkpoint import CheckpointDir
from minidl.data import make_embedded_dataset
from minidl.distributed.watchdog import ANSWER_SECONDS
from mpi import hosts
from mpi.job import Job

pytestmark = pytest.mark.slow  # mpiexec across namespaces, a deadline of 20 s

TIMEOUT, WARNING, PER_RANK, STEPS = 20, 5, 8, 5  # 4 ranks × 8 = 32 images a step, 5 steps an epoch
PROBE = Path(__file__).resolve().parents[1] / "training" / "read_probe.py"
TRAIN = Path(__file__).resolve().parents[2] / "train.py"
FLAGS = ["--model", "resnet8_w8", "--train-crop-size", 16, "--val-crop-size", 16, "--val-resize-size", 16,
         "--augment", "none", "--print-freq", 1, "--workers", 0, "--checkpoint-every", 2,
         "--collective-timeout", TIMEOUT, "--stall-warning", WARNING]


def train(made, data, output_dir, on, *flags):
    """train.py under the read probe on hosts `on`, two ranks each."""
    return made.start(str(PROBE), 2, data / "train", output_dir, 0, TRAIN, "--data-path", data, "--output-dir",
                      output_dir, *FLAGS, *flags, on=on)


def reads(output_dir, ranks):
    """[the training images each rank of `ranks` (ranks.json's entries) read, in order]."""
    return [(output_dir / f"reads-{entry['pid']}.txt").read_text().split() for entry in ranks]


def step_images(per_rank, share, step):
    """The images all ranks read in `step` (counted from 0 over the run): each reads `share` a step, in order."""
    return sorted(image for rank in per_rank for image in rank[step * share:(step + 1) * share])


def gone(pid):
    try:
        Path(f"/proc/{pid}").stat()
    except FileNotFoundError:
        return True
    return False


@pytest.mark.parametrize("cut", [1, 0])
def test_a_host_cut_off_is_named_the_job_ends_and_the_other_host_resumes_mid_epoch(cluster, cut):
    made = cluster(2)
    data = make_embedded_dataset(made.shared / "data", train_per_class=16, val_per_class=2)
    run = made.shared / "run"
    run.mkdir()
    job = Job(train(made, data, run, None, "-b", PER_RANK, "--epochs", 20), run)
    ranks = job.ranks()
    # cut off inside step 4 of an epoch: its step-2 checkpoint is the newest, steps 3 and 4 are lost
    job.wait_until(lambda: any(s["iteration"] % STEPS == 3 for s in job.steps()), 120, "step 3 of an epoch")
    made.cut(hosts.host_name(cut))
    cut_at = time.monotonic()

    status = job.end(TIMEOUT + 30)
    ended = time.monotonic() - cut_at
    survivor = 0 if cut else 2  # rank 0, else its deputy: the first rank of the other host
    lost = [2 * cut, 2 * cut + 1]
    unreachable = "; ".join(f"rank {r} \\(pid {ranks[r]['pid']} on {hosts.host_name(cut)}; unreachable: no answer "
                            f"from {hosts.host_name(cut)} in {ANSWER_SECONDS:g} s\\)" for r in lost)
    line = re.search(rf"minidl: collective timeout \(--collective-timeout {TIMEOUT}\): rank {survivor} has waited "
                     rf"[\d.]+ s in (\S+ ?\d*) at step (\d+); stalled: {unreachable}; aborting the job",
                     "".join(job.err))
    assert status != 0 and line, job.output()
    assert ended < TIMEOUT + 30
    while not all(gone(entry["pid"]) for entry in ranks):  # the cut-off ranks end by their own deadlines
        assert time.monotonic() < cut_at + TIMEOUT + 30, f"ranks left: {[e for e in ranks if not gone(e['pid'])]}"
        time.sleep(0.1)
    gone_after = time.monotonic() - cut_at

    path, _, meta = CheckpointDir(run, 3).load_latest(warn=pytest.fail)  # loads, its SHA-256 checked
    epoch, done = meta["epoch"], meta["step"]
    assert 0 < done < STEPS, meta
    print(f"\nhost {cut} cut off: the job ended {ended:.1f} s after the cut, every rank {gone_after:.1f} s after "
          f"it; resumed from epoch {epoch + 1}, step {done}; {line[0]}")
    before = reads(run, ranks)
    resumed = Job(train(made, data, run, [hosts.host_name(1 - cut)], "-b", 2 * PER_RANK, "--epochs", epoch + 1,
                        "--resume", "auto"), run)
    assert resumed.end(120) == 0, resumed.output()
    assert f"resumed from {path} at epoch {epoch + 1}, step {done}" in "".join(resumed.out)
    after = reads(run, json.loads((run / "ranks.json").read_text()))
    assert len(after) == 2 and all(len(images) == (STEPS - done) * 2 * PER_RANK for images in after)

    first = epoch * STEPS  # the interrupted epoch's first step in the cut run
    kept = [step_images(before, PER_RANK, first + s) for s in range(done)]
    again = [step_images(after, 2 * PER_RANK, s) for s in range(STEPS - done)]
    completed = min(len(images) for images in before) // PER_RANK - first  # steps every rank read whole
    for s in range(done, min(completed, STEPS)):  # a lost step reads the same images again
        assert again[s - done] == step_images(before, PER_RANK, first + s), f"step {s + 1} of epoch {epoch + 1}"
    epoch_reads = Counter(image for images in kept + again for image in images)
    every_image = sorted(str(p.relative_to(data / "train")) for p in (data / "train").rglob("*.png"))
    assert sorted(epoch_reads) == every_image and set(epoch_reads.values()) == {1}
