"""Checkpoints: bit-exact round trips, atomic writes under crashes, one-line errors for bad
files, model compatibility, the training state, and an output directory's naming/pruning."""
import json
import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

from helpers import rng
from minidl import checkpoint, models, nn
from minidl.checkpoint import (CheckpointDir, check_compatible, load_checkpoint, restore_training_state,
                               save_checkpoint, training_state)
from minidl.errors import UserError
from minidl.optim import LARS, SGD


def sample_arrays(seed=0):
    r = rng(seed)
    return {"optimizer/params": r.standard_normal(1000).astype(np.float32),
            "optimizer/momentum": np.array([np.nan, np.inf, -0.0, 1e-45], dtype=np.float32),  # odd bits survive
            "buffers/layer1.0.bn1.running_mean": r.standard_normal((3,)).astype(np.float32),
            "rng/state": r.integers(0, 2**63, size=(4, 2), dtype=np.uint64),
            "scalar": np.array(7, dtype=np.int64)}


META = {"model": "resnet20", "parameter_count": 272474, "epoch": 3, "step": 17, "iteration": 12345,
        "lr": 0.1 / 3, "global_batch": 256, "world_size": 4, "config": {"lr": 0.1, "lr_steps": [30, 60]},
        "ranks": [{"sampler": {"epoch": 3, "position": 17 * 64}} for _ in range(4)]}


def assert_arrays_identical(actual, expected):
    assert sorted(actual) == sorted(expected)
    for name in expected:
        assert actual[name].dtype == expected[name].dtype, name
        assert actual[name].tobytes() == expected[name].tobytes(), name


def one_line_error(call, *words):
    with pytest.raises(UserError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and ": " in message, message  # one line: the problem, then the fix
    for word in words:
        assert word in message, message
    return message


def test_round_trip_is_bit_exact(tmp_path):
    arrays = sample_arrays()
    save_checkpoint(tmp_path / "c.h5", arrays, META)
    loaded, meta = load_checkpoint(tmp_path / "c.h5")
    assert_arrays_identical(loaded, arrays)
    assert meta == META and meta["lr"] == 0.1 / 3  # floats survive JSON exactly
    assert os.listdir(tmp_path) == ["c.h5"]


def test_file_layout_is_readable_with_plain_h5py(tmp_path):
    save_checkpoint(tmp_path / "c.h5", sample_arrays(), META)
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert f.attrs["format"] == "minidl-checkpoint" and f.attrs["version"] == checkpoint.FORMAT_VERSION
        np.testing.assert_array_equal(f["arrays/buffers/layer1.0.bn1.running_mean"][()],
                                      sample_arrays()["buffers/layer1.0.bn1.running_mean"])
        assert json.loads(bytes(f["meta"][()])) == META


@pytest.mark.parametrize("name", ["", "/abs", "a//b"])
def test_array_names_must_be_relative_paths(tmp_path, name):
    with pytest.raises(ValueError, match="relative paths"):
        save_checkpoint(tmp_path / "c.h5", {name: np.zeros(1)}, {})
    assert os.listdir(tmp_path) == []


def test_numpy_scalars_in_meta_become_numbers_and_arrays_are_refused(tmp_path):
    save_checkpoint(tmp_path / "c.h5", {}, {"lr": np.float32(0.5), "step": np.int64(3)})
    assert load_checkpoint(tmp_path / "c.h5")[1] == {"lr": 0.5, "step": 3}
    with pytest.raises(TypeError, match="not `meta`"):
        save_checkpoint(tmp_path / "d.h5", {}, {"state": np.zeros(3)})


@pytest.mark.parametrize("crash_in", ["fsync", "replace"])
def test_a_failed_write_leaves_the_previous_checkpoint_and_no_temporary(tmp_path, monkeypatch, crash_in):
    path = tmp_path / "c.h5"
    save_checkpoint(path, sample_arrays(0), META)
    good = path.read_bytes()

    def crash(*args):
        raise OSError("No space left on device")
    monkeypatch.setattr(os, crash_in, crash)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint(path, sample_arrays(1), dict(META, iteration=99999))
    monkeypatch.undo()
    assert path.read_bytes() == good and os.listdir(tmp_path) == ["c.h5"]


@pytest.mark.slow
def test_a_killed_writer_leaves_the_previous_checkpoint(tmp_path):
    """A process that dies between writing and renaming (kill -9, power loss) leaves its temporary
    file, which no one takes for a checkpoint, and the old checkpoint under the final name."""
    directory = CheckpointDir(tmp_path, keep=3)
    first = directory.save(sample_arrays(0), META, epoch=0, iteration=10)
    script = textwrap.dedent(f"""
        import os, numpy
        from minidl.checkpoint import CheckpointDir
        os.fsync = lambda fd: os._exit(9)  # die with the bytes written, before the rename
        CheckpointDir({str(tmp_path)!r}, keep=3).save({{"x": numpy.ones(10)}}, {{}}, epoch=0, iteration=20)
    """)
    assert subprocess.run([sys.executable, "-c", script], timeout=60).returncode == 9
    leftovers = [name for name in os.listdir(tmp_path) if name != first.name]
    assert len(leftovers) == 1 and leftovers[0].startswith(".checkpoint-e000-i00000020.h5.")
    path, arrays, _ = directory.load_latest()
    assert path == first
    assert_arrays_identical(arrays, sample_arrays(0))
    directory.save({}, {}, epoch=0, iteration=30)  # the next save clears the leftover
    assert names(tmp_path) == [first.name, "checkpoint-e000-i00000030.h5"]


def test_truncated_checkpoint_is_one_line_error_and_the_previous_one_is_untouched(tmp_path):
    directory = CheckpointDir(tmp_path, keep=3)
    previous = directory.save(sample_arrays(0), META, epoch=0, iteration=100)
    previous_bytes = previous.read_bytes()
    newest = directory.save(sample_arrays(1), META, epoch=0, iteration=200)
    newest.write_bytes(newest.read_bytes()[:len(newest.read_bytes()) // 2])
    one_line_error(lambda: load_checkpoint(newest), str(newest), "truncated", "older checkpoint")
    warnings = []
    path, arrays, _ = directory.load_latest(warn=warnings.append)
    assert path == previous and previous.read_bytes() == previous_bytes
    assert_arrays_identical(arrays, sample_arrays(0))
    assert len(warnings) == 1 and str(newest) in warnings[0]


def test_flipped_bit_is_caught_by_the_checksum(tmp_path):
    arrays = sample_arrays()
    path = tmp_path / "c.h5"
    save_checkpoint(path, arrays, META)
    data = bytearray(path.read_bytes())
    where = data.find(arrays["optimizer/params"].tobytes())
    assert where > 0
    data[where + 123] ^= 0x01
    path.write_bytes(bytes(data))
    one_line_error(lambda: load_checkpoint(path), str(path), "checksum")


def test_edited_metadata_is_caught_by_the_checksum(tmp_path):
    path = tmp_path / "c.h5"
    save_checkpoint(path, sample_arrays(), META)
    with h5py.File(path, "r+") as f:
        del f["meta"]
        f["meta"] = np.frombuffer(b'{"model": "resnet50"}', dtype=np.uint8)
    one_line_error(lambda: load_checkpoint(path), "checksum")


@pytest.mark.parametrize("problem,words", [
    ("missing", ["does not exist", "--resume auto"]),
    ("text", ["not HDF5"]),
    ("foreign_hdf5", ["not a minidl checkpoint"]),
    ("future_version", ["format version 2", "reads version 1"]),
])
def test_bad_files_are_one_line_errors(tmp_path, problem, words):
    path = tmp_path / "c.h5"
    if problem == "text":
        path.write_text("not a checkpoint\n")
    elif problem == "foreign_hdf5":
        with h5py.File(path, "w") as f:
            f["x"] = np.zeros(3)
    elif problem == "future_version":
        save_checkpoint(path, sample_arrays(), META)
        with h5py.File(path, "r+") as f:
            f.attrs["version"] = 2
    one_line_error(lambda: load_checkpoint(path), str(path), *words)


def test_checkpoint_of_another_model_is_refused():
    check_compatible("c.h5", META, "resnet20", 272474)
    meta = dict(META, model="resnet50", parameter_count=25_557_032)
    message = one_line_error(lambda: check_compatible("runs/a/c.h5", meta, "resnet20", 272474), "--model")
    assert message.startswith("checkpoint runs/a/c.h5 is for resnet50 (25,557,032 parameters), "
                              "this run builds resnet20 (272,474 parameters)")
    one_line_error(lambda: check_compatible("c.h5", META, "resnet20", 272474 + 650), "272,474", "273,124")
    one_line_error(lambda: check_compatible("c.h5", {}, "resnet20", 272474), "None (? parameters)")


# --- the training state ------------------------------------------------------------------------

def trained_pair(seed, optimizer=SGD):
    """A resnet20 and its optimizer (rate 0.1·seed) after one step with random gradients and BN
    statistics."""
    nn.manual_seed(seed)
    model = models.resnet20(num_classes=10)
    opt = optimizer(model.parameters(), lr=0.1 * seed, momentum=0.9, weight_decay=1e-4)
    r = rng(seed)
    opt.flat.grad[:opt.flat.size] = r.standard_normal(opt.flat.size)
    opt.step()
    for _, buffer in model.named_buffers():
        buffer[...] = r.random(buffer.shape)
    return model, opt


@pytest.mark.parametrize("optimizer", [SGD, LARS])
def test_training_state_round_trip_restores_in_place(tmp_path, optimizer):
    model, opt = trained_pair(1, optimizer)
    arrays, meta = training_state(model, opt)
    assert meta == {"optimizer": optimizer.__name__, "parameter_count": model.num_parameters(),
                    "previous_lr": 0.1}
    save_checkpoint(tmp_path / "c.h5", arrays, dict(meta, model="resnet20"))
    expected = {name: np.array(array) for name, array in arrays.items()}

    other_model, other_opt = trained_pair(2, optimizer)
    views = [p.data for p in other_opt.params]
    restore_training_state(tmp_path / "c.h5", *load_checkpoint(tmp_path / "c.h5"), other_model, other_opt)
    assert_arrays_identical({k: np.asarray(v) for k, v in training_state(other_model, other_opt)[0].items()},
                            expected)
    assert all(p.data is view and np.shares_memory(view, other_opt.flat.data)
               for p, view in zip(other_opt.params, views))
    for (name, ours), (_, theirs) in zip(model.named_parameters(), other_model.named_parameters()):
        np.testing.assert_array_equal(ours.data, theirs.data, err_msg=name)
    assert other_opt.previous_lr == meta["previous_lr"]


def test_restoring_into_another_model_or_optimizer_is_refused():
    model, opt = trained_pair(1)
    arrays, meta = training_state(model, opt)
    nn.manual_seed(0)
    bigger = models.resnet32(num_classes=10)
    one_line_error(lambda: restore_training_state("c.h5", arrays, meta, bigger, SGD(bigger.parameters(), lr=0.1)),
                   "c.h5", "optimizer/params", "float32[")
    lars = LARS(models.resnet20(num_classes=10).parameters(), lr=0.1)
    one_line_error(lambda: restore_training_state("c.h5", arrays, meta, model, lars), "SGD", "LARS", "--opt")
    del arrays["buffers/bn1.running_var"]
    one_line_error(lambda: restore_training_state("c.h5", arrays, meta, model, opt), "lacks buffers/bn1.running_var")



@pytest.mark.parametrize("optimizer", [SGD, LARS])
def test_flat_buffers_restore_into_another_padding(optimizer):
    """The flat buffers' padding follows the grid of ranks (the all-reduce's alignment): a run
    resumed on another grid restores the parameters and momentum into its own padded length."""
    model, opt = trained_pair(1, optimizer)
    arrays, meta = training_state(model, opt)
    saved = {name: np.array(array) for name, array in arrays.items()}
    used = opt.flat.size
    for align in (5120, 1):  # padded longer (a 5x1 grid), then not at all
        nn.manual_seed(2)
        other_model = models.resnet20(num_classes=10)
        other = optimizer(other_model.parameters(), lr=0.5, momentum=0.9, align=align)
        restore_training_state("c.h5", saved, meta, other_model, other)
        restored, _ = training_state(other_model, other)
        for name in ("optimizer/params", "optimizer/momentum"):
            assert len(restored[name]) != len(saved[name])
            assert restored[name][:used].tobytes() == saved[name][:used].tobytes(), name
            assert not restored[name][used:].any()
        for (_, ours), (_, theirs) in zip(model.named_parameters(), other_model.named_parameters()):
            np.testing.assert_array_equal(ours.data, theirs.data)
    saved["optimizer/params"][used] = 1.0  # past the parameters: not this model's buffer
    one_line_error(lambda: restore_training_state("c.h5", saved, meta, other_model, other), "optimizer/params")

# --- an output directory ---------------------------------------------------------------------

def names(directory):
    return sorted(p.name for p in directory.iterdir())


def test_keep_last_k_and_never_the_one_just_written(tmp_path):
    directory = CheckpointDir(tmp_path, keep=2)
    (tmp_path / "metrics.jsonl").write_text("")
    diagnostic = directory.save_diagnostic({}, {}, iteration=5)
    for epoch, iteration in [(0, 10), (1, 20), (1, 30), (2, 40)]:
        directory.save({"x": np.full(3, iteration)}, {"iteration": iteration}, epoch, iteration)
    assert names(tmp_path) == ["checkpoint-e001-i00000030.h5", "checkpoint-e002-i00000040.h5",
                               diagnostic.name, "metrics.jsonl"]
    # a run restarted from scratch in the same folder writes a lower iteration: that one stays
    directory.save({"x": np.zeros(3)}, {}, epoch=0, iteration=1)
    assert names(tmp_path) == ["checkpoint-e000-i00000001.h5", "checkpoint-e002-i00000040.h5",
                               diagnostic.name, "metrics.jsonl"]


def test_latest_is_the_highest_iteration_and_ignores_diagnostics(tmp_path):
    directory = CheckpointDir(tmp_path, keep=5)
    assert directory.load_latest() is None
    for epoch, iteration in [(0, 900), (1, 1000), (0, 950)]:  # written out of order
        directory.save({"x": np.full(2, iteration)}, {"iteration": iteration}, epoch, iteration)
    directory.save_diagnostic({"x": np.zeros(2)}, {"iteration": 5000}, iteration=5000)
    (tmp_path / "checkpoint-e001-i00002000.h5.bak").write_text("")  # not a checkpoint name
    path, arrays, meta = directory.load_latest()
    assert path.name == "checkpoint-e001-i00001000.h5" and meta == {"iteration": 1000}
    assert [i for i, _, _ in directory.regular()] == [900, 950, 1000]


def test_no_readable_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    directory = CheckpointDir(tmp_path, keep=5)
    directory.save({}, {}, epoch=0, iteration=1).write_text("garbage")
    one_line_error(lambda: directory.load_latest(warn=lambda message: None), "none of the 1", "--output-dir")


def test_diagnostic_checkpoints_never_overwrite(tmp_path):
    directory = CheckpointDir(tmp_path, keep=1)
    regular = directory.save({"x": np.ones(2)}, {}, epoch=0, iteration=7)
    first = directory.save_diagnostic({"x": np.full(2, np.nan)}, {"loss": float("nan")}, iteration=7)
    second = directory.save_diagnostic({"x": np.full(2, np.inf)}, {}, iteration=7)
    assert (first.name, second.name) == ("checkpoint-nonfinite-i00000007.h5", "checkpoint-nonfinite-i00000007-1.h5")
    assert np.isnan(load_checkpoint(first)[0]["x"]).all() and np.isinf(load_checkpoint(second)[0]["x"]).all()
    np.testing.assert_array_equal(load_checkpoint(regular)[0]["x"], 1)
    with pytest.raises(ValueError):
        directory.save_diagnostic({}, {}, iteration=8, label="e1")
