"""The autotuner's safety net, with fake plans, runs and clocks (no kernels run): a plan that
raises or disagrees with v1 is recorded, never chosen and never run again, also by a later
process on the same cache; only validated plans are candidates; a window of back-to-back calls
spans the timing window; one process decides for all; MINIDL_AUTOTUNE=0 means no tuner and no
canary."""
import json

import numpy
import pytest

from minidl import kernels
from minidl.kernels import autotune
from minidl.kernels.autotune import Autotuner, Plan

KIND = "conv_fwd"
V1, GOOD, RAISES, WRONG, UNVALIDATED = (Plan("v1", "Bf16Tile"), Plan("v2", "good"), Plan("v2", "raises"),
                                        Plan("v2", "wrong"), Plan("v2", "unvalidated"))
PLANS = [V1, GOOD, RAISES, WRONG, UNVALIDATED]
TRUTH = numpy.array([1.0, -2.0, 3.0], dtype=numpy.float32)
FAST = {V1: 3.0, GOOD: 2.0, RAISES: 0.5, WRONG: 0.5, UNVALIDATED: 0.1}  # the broken ones would win


def validate_all_but_unvalidated(known, record):
    """The canary's part: every kernel not `known` yet found ok (the broken ones only break later)."""
    for plan in (GOOD, RAISES, WRONG):
        if plan.kernel_name(KIND) not in known:
            record(plan.kernel_name(KIND), {"status": "ok", "error": None, "max_error": 0.0, "seconds": 0.0})


class FakeCall:
    """run(plan) and a timer: outputs per plan, and the time of the plan last run."""

    def __init__(self):
        self.ran = []

    def run(self, plan):
        self.ran.append(plan)
        if plan == RAISES:
            raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure")
        return (TRUTH * (5.0 if plan == WRONG else 1.0 + 1e-3 * (plan == GOOD)),)

    def timer(self, function):
        function()
        return FAST[self.ran[-1]]


def tuner(path, call, **options):
    return Autotuner(call.timer, path, validate=validate_all_but_unvalidated, **options)


def test_a_failing_or_mismatching_plan_is_never_chosen_nor_retried(tmp_path, capsys):
    path, call = tmp_path / "autotune" / "emu.json", FakeCall()
    chosen = tuner(path, call).choose("key a", lambda: PLANS, call.run, KIND, 3e-2)
    assert chosen == GOOD, "the fastest validated plan that agrees with v1"
    assert UNVALIDATED not in call.ran, "a plan not validated on this device never runs"
    statuses = json.loads(path.read_text())["plans"]
    assert statuses[RAISES.kernel_name(KIND)]["status"] == "failed"
    assert "unspecified launch failure" in statuses[RAISES.kernel_name(KIND)]["error"]
    assert statuses[WRONG.kernel_name(KIND)]["status"] == "mismatch"
    assert statuses[WRONG.kernel_name(KIND)]["max_error"] == pytest.approx(4.0)
    told = capsys.readouterr().err
    assert told.count("not used again") == 2 and "raises" in told and "wrong" in told

    again = FakeCall()  # a later process on the same cache, a new key: the broken plans never run
    later = tuner(path, again)
    assert later.choose("key b", lambda: PLANS, again.run, KIND, 3e-2) == GOOD
    assert set(again.ran) == {V1, GOOD}
    rows = {row["plan"]: row for row in later.report()["candidates"]["key b"]}
    assert rows[RAISES.label()]["status"] == "failed" and rows[WRONG.label()]["status"] == "mismatch"
    assert rows[UNVALIDATED.label()]["status"] == "failed" and rows[GOOD.label()]["seconds"] == 2.0


def test_the_choice_is_always_a_validated_plan(tmp_path):
    """No validation at all (or every v2 plan broken): v1 runs, untimed."""
    call = FakeCall()
    alone = Autotuner(call.timer, tmp_path / "c.json")
    assert alone.choose("key", lambda: PLANS, call.run, KIND, 3e-2) == V1 and call.ran == []
    call = FakeCall()
    broken = tuner(tmp_path / "d.json", call)
    assert broken.choose("key", lambda: [V1, RAISES, WRONG], call.run, KIND, 3e-2) == V1


def test_a_cached_choice_that_since_failed_is_not_used(tmp_path):
    path, call = tmp_path / "e.json", FakeCall()
    first = tuner(path, call)
    assert first.choose("key", lambda: [V1, GOOD], call.run, KIND, 3e-2) == GOOD
    first.statuses[GOOD.kernel_name(KIND)]["status"] = "failed"
    first._write_cache()
    call = FakeCall()
    assert tuner(path, call).choose("key", lambda: [V1, GOOD], call.run, KIND, 3e-2) == V1


def test_other_sources_invalidate_the_cache(tmp_path):
    path, call = tmp_path / "f.json", FakeCall()
    tuner(path, call, source_hash="old").choose("key", lambda: PLANS, call.run, KIND, 3e-2)
    fresh = Autotuner(call.timer, path, source_hash="new")
    assert fresh.statuses == {} and fresh._cache["choices"] == {}


def test_validation_runs_once_and_says_so(tmp_path, capsys):
    ran = []

    def validate(known, record):
        ran.append(dict(known))
        record(GOOD.kernel_name(KIND), {"status": "ok", "error": None, "max_error": 0.0, "seconds": 0.1})
        record(RAISES.kernel_name(KIND), {"status": "failed", "error": "illegal address", "max_error": None,
                                          "seconds": None})

    call = FakeCall()
    first = Autotuner(call.timer, tmp_path / "g.json", device="H200", validate=validate)
    first.choose("key a", lambda: [V1, GOOD], call.run, KIND, 3e-2)
    first.choose("key b", lambda: [V1, GOOD], call.run, KIND, 3e-2)
    assert len(ran) == 1
    line = capsys.readouterr().out
    assert "validated 2 kernel plans on H200" in line and f"1 failed: {RAISES.kernel_name(KIND)}" in line
    Autotuner(call.timer, tmp_path / "g.json", validate=validate).validated()
    assert ran[1].keys() == {GOOD.kernel_name(KIND), RAISES.kernel_name(KIND)}, "a later process knows them"


class FakeAgreement:
    """Another rank's view of the job: whether it leads its node, the plans that failed on other
    nodes, and rank 0's decision (`label`; None: this is rank 0, it decides)."""

    def __init__(self, leads_node, label=None, failed_elsewhere=()):
        self.leads_node, self.label, self.failed_elsewhere = leads_node, label, set(failed_elsewhere)

    def union(self, names):
        return set(names) | self.failed_elsewhere

    def decide(self, function):
        return function() if self.label is None else self.label


def test_a_follower_neither_validates_nor_times(tmp_path):
    call, validations = FakeCall(), []
    follower = Autotuner(call.timer, tmp_path / "h.json", validate=lambda known, record: validations.append(1),
                         agreement=FakeAgreement(False, GOOD.label()))
    assert follower.choose("key", lambda: PLANS, call.run, KIND, 3e-2) == GOOD
    assert validations == [] and call.ran == []


def test_a_plan_failed_on_another_node_fails_here(tmp_path):
    call = FakeCall()
    leader = tuner(tmp_path / "i.json", call, agreement=FakeAgreement(True, None, {GOOD.kernel_name(KIND)}))
    assert leader.choose("key", lambda: [V1, GOOD], call.run, KIND, 3e-2) == V1 and GOOD not in call.ran
    assert leader.report()["validation"]["failed"] == [GOOD.kernel_name(KIND)]


class FakeClock:
    """A clock that only calls advance, by `seconds(call number)` each: open_window() for
    windowed_timer, keeping the span of every window."""

    def __init__(self, seconds):
        self.now, self.calls, self.spans, self.seconds = 0.0, 0, [], seconds

    def call(self):
        self.calls += 1
        self.now += self.seconds(self.calls)

    def open_window(self):
        start = self.now

        def close():
            self.spans.append(self.now - start)
            return self.now - start
        return close


@pytest.mark.parametrize("first, later", [(2.0 ** -13, 2.0 ** -13), (2.0 ** -9, 2.0 ** -15)])
def test_a_timing_window_spans_the_window_length(first, later):
    """Calls of 2^-13 s (0.12 ms; powers of two: exact sums), or a first call of 2^-9 s (2 ms: a
    compile, the host's latency) and calls of 2^-15 s (31 µs) after it: each timed window holds
    >= 1 ms of calls, and the time per call is the call's, not the window's."""
    clock = FakeClock(lambda call: first if call == 1 else later)
    assert autotune.windowed_timer(clock.open_window)(clock.call) == later
    timed = clock.spans[-autotune.WINDOWS:]
    assert all(span >= autotune.WINDOW_SECONDS for span in timed), timed


def test_autotune_off_means_no_tuner_and_no_canary(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIDL_CACHE", str(tmp_path))
    monkeypatch.setenv("MINIDL_AUTOTUNE", "0")
    assert kernels.tuner_for("emulator", "emu", lambda function: 0.0) is None
    monkeypatch.setenv("MINIDL_AUTOTUNE", "1")
    tuner_on = kernels.tuner_for("emulator", "emu", lambda function: 0.0)
    assert tuner_on is not None and tuner_on.validate is not None


def test_canary_off_means_no_v2_plan_runs_even_validated_in_the_cache(monkeypatch, tmp_path):
    from minidl.kernels import canary
    monkeypatch.setenv("MINIDL_CACHE", str(tmp_path))
    call = FakeCall()
    tuner(autotune.cache_path(tmp_path, "emulator", "emu"), call, source_hash=canary.source_hash()).validated()
    monkeypatch.setenv("MINIDL_CANARY", "0")
    off = kernels.tuner_for("emulator", "emu", call.timer)
    assert off.validate is None and off.choose("key", lambda: PLANS, call.run, KIND, 3e-2) == V1 and call.ran == []
    rows = off.report()["candidates"]["key"][1:]
    assert all(r["status"] == "failed" and r["error"] == "not validated on this device" for r in rows), rows


def test_device_kernels_must_name_a_module_and_function(monkeypatch):
    from minidl import environment
    from minidl.errors import UserError
    monkeypatch.setenv("MINIDL_DEVICE_KERNELS", "emulated_device")
    with pytest.raises(UserError, match="module:function"):
        environment.value("MINIDL_DEVICE_KERNELS")
    monkeypatch.setenv("MINIDL_DEVICE_KERNELS", "emulated_device:device")
    assert environment.value("MINIDL_DEVICE_KERNELS") == ("emulated_device", "device")


def test_a_run_writes_the_tuner_report_and_says_it_once(tmp_path, capsys):
    from minidl.training.outputs import RunOutputs
    call = FakeCall()
    tuned = tuner(tmp_path / "j.json", call)
    tuned.choose("key", lambda: PLANS, call.run, KIND, 3e-2)
    outputs = RunOutputs(tmp_path / "run", True)
    (tmp_path / "run").mkdir()
    outputs.tuning(tuned.report())
    outputs.tuning(tuned.report())
    written = json.loads((tmp_path / "run" / "autotune.json").read_text())
    assert [row["status"] for row in written["candidates"]["key"]] == ["ok", "ok", "failed", "mismatch", "failed"]
    assert written["choices"] == {"key": GOOD.label()}
    told = [line for line in capsys.readouterr().out.splitlines() if "autotuned" in line]
    assert len(told) == 1 and "2 kernel plans failed or disagreed" in told[0]


class CountingAgreement(FakeAgreement):
    """Rank 0's agreement that counts its collectives (each a call every rank must make)."""

    def __init__(self):
        super().__init__(True)
        self.decisions, self.unions = 0, 0

    def union(self, names):
        self.unions += 1
        return super().union(names)

    def decide(self, function):
        self.decisions += 1
        return function()


def test_evaluation_decides_alone(tmp_path, monkeypatch):
    """Evaluation batches differ across ranks: a key first met there makes no collective call;
    training after it decides over the ranks again, also a key evaluation met."""
    from minidl.training import evaluator

    call, agreement = FakeCall(), CountingAgreement()
    tuned = tuner(tmp_path / "k.json", call, agreement=agreement)

    class Fake:  # the kernels in use, the model, optimizer, loader and communicator of one rank
        tuner, size, skipped, flat = tuned, 1, 0, None

        def __init__(self):
            self.flat = self

        def refresh_bf16_copy(self):
            pass

        def named_buffers(self):
            return []

        def eval(self):
            pass

        def sum(self, values):
            return values

        def __iter__(self):
            return iter([(None, numpy.zeros(3, int)), (None, numpy.zeros(2, int))])  # a last, smaller batch

    def forward_loss(model, images, labels, label_smoothing):  # a tuned convolution per batch size
        tuned.choose(f"batch {len(labels)}", lambda: PLANS, call.run, KIND, 3e-2)
        return numpy.zeros((len(labels), 5)), numpy.float32(1.0)

    class Data:
        def __init__(self, array):
            self.data = array

    monkeypatch.setattr(evaluator, "forward_loss", lambda *a: tuple(map(Data, forward_loss(*a))))
    fake = Fake()
    with kernels.use(fake, numpy.ndarray):
        evaluator.Evaluator(fake, fake, fake, fake, 0.0)()
        assert agreement.decisions == 0 and set(tuned.candidates) == {"batch 3", "batch 2"}
        assert agreement.unions == 1, "validated over the ranks, where every rank is"
        assert tuned.agreement is agreement and tuned.choices == {}, "training decides over the ranks again"
        assert tuned.choose("batch 3", lambda: PLANS, call.run, KIND, 3e-2) == GOOD
        assert agreement.decisions == 1
    fake.tuner = None  # a device without a tuner (MINIDL_AUTOTUNE=0), and the CPU (no kernels at all)
    with kernels.use(fake, numpy.ndarray):
        evaluator.Evaluator(fake, fake, fake, fake, 0.0)()
    evaluator.Evaluator(fake, fake, fake, fake, 0.0)()


class CudaRuntimeCall(FakeCall):
    """run(plan) raising CuPy-like errors (the same class names) for the plans in `errors`."""

    def __init__(self, errors):
        super().__init__()
        self.errors = errors

    def run(self, plan):
        if plan in self.errors:
            self.ran.append(plan)
            raise self.errors[plan]
        return super().run(plan)


OutOfMemoryError = type("OutOfMemoryError", (MemoryError,), {})
CUDARuntimeError = type("CUDARuntimeError", (RuntimeError,), {})


def test_out_of_memory_is_not_the_kernels_failure(tmp_path):
    path = tmp_path / "l.json"
    call = CudaRuntimeCall({GOOD: OutOfMemoryError("out of memory allocating 1,073,741,824 bytes")})
    with pytest.raises(OutOfMemoryError):
        tuner(path, call).choose("key", lambda: [V1, GOOD], call.run, KIND, 3e-2)
    assert json.loads(path.read_text())["plans"][GOOD.kernel_name(KIND)]["status"] == "ok"


def test_a_sticky_cuda_error_fails_its_plan_only_and_is_raised(tmp_path):
    path = tmp_path / "m.json"
    call = CudaRuntimeCall({RAISES: CUDARuntimeError("cudaErrorIllegalAddress: an illegal address was encountered")})
    with pytest.raises(CUDARuntimeError):
        tuner(path, call).choose("key", lambda: [V1, RAISES, WRONG, GOOD], call.run, KIND, 3e-2)
    statuses = json.loads(path.read_text())["plans"]
    assert statuses[RAISES.kernel_name(KIND)]["status"] == "failed"
    assert statuses[WRONG.kernel_name(KIND)]["status"] == "ok" and statuses[GOOD.kernel_name(KIND)]["status"] == "ok"
    assert call.ran[-1] == RAISES and WRONG not in call.ran, "no later candidate runs in a lost context"


def test_the_timed_call_is_the_launch_alone(tmp_path):
    """The comparison's work (`outputs`: finalizing statistics, masking) is done once per plan,
    outside the timed calls, so it biases no plan's time."""
    call, compared = FakeCall(), []

    def outputs(result):
        compared.append(call.ran[-1])
        return result

    def timer(function):
        before = len(compared)
        for _ in range(3):
            function()
        assert len(compared) == before, "the timed function compares nothing"
        return FAST[call.ran[-1]]

    tuned = Autotuner(timer, tmp_path / "n.json", validate=validate_all_but_unvalidated)
    assert tuned.choose("key", lambda: [V1, GOOD, WRONG], call.run, KIND, 3e-2, outputs) == GOOD
    assert compared == [V1, GOOD, WRONG]
