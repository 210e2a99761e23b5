"""The v3 convolutions (kernels/conv_v3.cu, sm_90a) in the tuner, on the emulated device: on a
device of compute capability 9.0 the canary validates every v3 plan in its child processes and
the tuner offers, checks and times them beside v1 and v2, never choosing one the canary rejected;
below 9.0 every v3 plan is recorded unavailable, with the reason, and none is ever launched."""
import json
import os
from pathlib import Path

import pytest

import oracle
from emulated_device import device_module, emulated_module
from minidl.kernels import Kernels, autotune, canary
from minidl.kernels.autotune import Autotuner
from test_emulated_conv_v2 import run_pass

HERE = Path(__file__).resolve().parent
SHAPE = (1, 5, 7, 64, 72, 3, 1, 1)  # a forward pass that every bf16 tile of v2 and v3 takes, unsplit
V3 = [p.name for p in canary.PLANS if p.plan.version == "v3"]
BROKEN_TILE = "V3Tile<256"  # the kernels of the 128×256 v3 tile (their template arguments)


def cache_with_v2_ok(tmp_path):
    """A tuner cache in which every v2 plan passed the canary: its validation runs the v3 plans only."""
    path = autotune.cache_path(tmp_path / "cache", "emulator", "emu")
    path.parent.mkdir(parents=True)
    plans = {p.name: {"status": "ok", "error": None, "max_error": 0.0, "seconds": 0.1}
             for p in canary.PLANS if p.plan.version == "v2"}
    path.write_text(json.dumps({"source_hash": canary.source_hash(), "plans": plans, "choices": {}}))
    return path


class Clock:
    """The tuner's timer: it runs the call and gives it the seconds `seconds(kernel name)` of the
    first kernel the call launched (recorded by `watch`), so a test decides which plan is fastest."""

    def __init__(self, seconds):
        self.seconds, self.launched = seconds, []

    def watch(self, kernels):
        launch = kernels.launch

        def recorded(family, name, *args, **kwargs):
            self.launched.append(name)
            return launch(family, name, *args, **kwargs)
        kernels.launch = recorded
        return kernels

    def __call__(self, function):
        first = len(self.launched)
        function()
        return self.seconds(self.launched[first])


def tuned_forward(load, compute_capability, validate, cache, clock):
    """The forward pass of SHAPE on kernels of this compute capability, tuned: (result, reference, tuner)."""
    tuner = Autotuner(clock, cache, source_hash=canary.source_hash(), device="emulator", validate=validate)
    kernels = clock.watch(Kernels(load, 2, compute_capability=compute_capability, tuner=tuner))
    ours, reference = run_pass(kernels, "bf16", "conv_fwd", SHAPE)
    oracle.assert_close(ours, reference, oracle.TOLERANCE["bf16"], "the tuned forward pass")
    return tuner


def test_below_sm_90a_every_v3_plan_is_unavailable_and_never_launched(emulated, tmp_path, monkeypatch):
    monkeypatch.setattr(canary, "run_child", lambda *args: pytest.fail("a child was started: v2 is known"))
    clock = Clock(lambda name: 0.1 if "_v3<" in name else 1.0)  # v3 would win wherever it ran
    tuner = tuned_forward(emulated_module, "80", canary.validator(compute_capability="80"),
                          cache_with_v2_ok(tmp_path), clock)
    for name in V3:
        status = tuner.statuses[name]
        assert status["status"] == "unavailable" and "needs sm_90a" in status["error"] and "8.0" in status["error"]
    (candidates,) = tuner.report()["candidates"].values()
    v3 = [c for c in candidates if c["plan"].startswith("v3:")]
    assert len(v3) == 2 and all(c["status"] == "unavailable" and c["seconds"] is None for c in v3), v3
    assert not any(label.startswith("v3:") for label in tuner.report()["choices"].values())
    assert clock.launched and not any("_v3<" in name for name in clock.launched)


@pytest.mark.slow
def test_on_sm_90a_the_canary_validates_v3_and_a_rejected_tile_is_never_chosen(emulated, tmp_path, monkeypatch):
    """The 128×256 v3 tile writes wrong results (in the canary's children and here): the canary
    finds it a mismatch and the 128×128 tile ok; the tuner checks and times the 128×128 tile
    against v1 and chooses it (the clock makes v3 fastest), and never launches the broken one,
    though the clock would make it the fastest of all."""
    root = HERE.parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), str(HERE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("MINIDL_DEVICE_KERNELS", "emulated_device:device")
    monkeypatch.setenv("EMULATED_DEVICE_BREAK", "v3-wrong")
    monkeypatch.setenv("EMULATED_DEVICE_BREAK_KERNELS", BROKEN_TILE)
    clock = Clock(lambda name: 0.1 if BROKEN_TILE in name else 0.2 if "_v3<" in name else 1.0)
    tuner = tuned_forward(device_module, "90", canary.validator(compute_capability="90"), cache_with_v2_ok(tmp_path),
                          clock)
    for name in V3:
        status = tuner.statuses[name]
        if "bf16_128x256" in name:
            assert status["status"] == "mismatch" and status["max_error"] > autotune.TOLERANCE["bf16"], name
        else:
            assert status["status"] == "ok" and status["max_error"] <= autotune.TOLERANCE["bf16"], name
    (candidates,) = tuner.report()["candidates"].values()
    rows = {c["plan"]: c for c in candidates}
    assert rows["v3:bf16_128x128:1"]["status"] == "ok" and rows["v3:bf16_128x128:1"]["seconds"] == 0.2
    assert rows["v3:bf16_128x128:1"]["max_error"] <= autotune.TOLERANCE["bf16"]
    assert rows["v3:bf16_128x256:1"]["status"] == "mismatch" and rows["v3:bf16_128x256:1"]["seconds"] is None
    assert list(tuner.report()["choices"].values()) == ["v3:bf16_128x128:1"]
    assert not any(BROKEN_TILE in name for name in clock.launched)
