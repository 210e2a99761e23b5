"""The parts around the training step (minidl.training.parts): their triggers, and that the loop
runs each hook in list order without knowing the parts."""
from minidl.training import parts
from minidl.training.position import Position


def test_every_fires_on_each_nth_step_and_the_last():
    due = parts.every(3, 7)
    assert [n for n in range(1, 8) if due(n)] == [3, 6, 7]


class FakeBar:
    def __init__(self):
        self.updates, self.closed = 0, False

    def update(self, n):
        self.updates += n

    def close(self):
        self.closed = True


def test_progress_logs_when_due_and_closes_the_bar():
    bar, logged = FakeBar(), []
    progress = parts.Progress(bar, parts.every(2, 5), 16, lambda bar, rate: logged.append(rate))
    position = Position()
    for _ in range(5):
        position.advance()
        progress.after_step(position, stopping=False)
    progress.epoch_end()
    assert bar.updates == 5 and bar.closed and len(logged) == 3 and all(rate > 0 for rate in logged)


def test_checkpoints_inside_the_epoch_only_and_never_when_stopping():
    saved = []
    checkpoints = parts.Checkpoints(2, 4, lambda: saved.append(position.iteration))
    position = Position(epoch=1, step=0, iteration=4)
    for stopping in (False, False, True, False):  # iterations 5..8; step 4 of 4 is the epoch's end
        position.advance()
        checkpoints.after_step(position, stopping)
    assert saved == [6]
    assert not parts.Checkpoints(0, 4, lambda: saved.append("never")).after_step(position, False) and saved == [6]


def test_trace_window_numbers_the_step_to_come():
    class Trace:
        def __init__(self):
            self.calls = []

        def step_starting(self, number):
            self.calls.append(("start", number))

        def step_finished(self):
            self.calls.append(("finish",))

    trace = Trace()
    window = parts.TraceWindow(trace)
    position = Position(iteration=9)
    window.before_step(position)
    position.advance()
    window.after_step(position, stopping=False)
    assert trace.calls == [("start", 10), ("finish",)]


def test_a_part_needs_only_the_hooks_it_uses():
    class Counter(parts.Part):
        def __init__(self):
            self.after = 0

        def after_step(self, position, stopping):
            self.after += 1

    counter, position = Counter(), Position()
    counter.before_step(position)
    counter.after_step(position, False)
    counter.epoch_end()
    assert counter.after == 1


def test_a_part_added_to_the_trainer_sees_every_step_of_a_run(tmp_path, monkeypatch):
    """A part appended to Trainer.parts_for hears each step before and after it, with the position,
    and each epoch's end; the loop itself is untouched."""
    from minidl.config import Config
    from minidl.data import make_embedded_dataset
    from minidl.trainer import Trainer, run

    data = make_embedded_dataset(tmp_path / "data", train_per_class=4, val_per_class=1, image_size=16)
    heard = []

    class Recorder(parts.Part):
        def before_step(self, position):
            heard.append(("before", position.epoch, position.step))

        def after_step(self, position, stopping):
            heard.append(("after", position.epoch, position.step, stopping))

        def epoch_end(self):
            heard.append(("end",))

    built = Trainer.parts_for
    monkeypatch.setattr(Trainer, "parts_for", lambda self, epoch: [*built(self, epoch), Recorder()])
    run(Config(data_path=str(data), model="resnet20", batch_size=16, epochs=2, lr=0.01, lr_base_batch=16,
               train_crop_size=16, val_crop_size=16, val_resize_size=16, augment="none",
               output_dir=str(tmp_path / "out"), print_freq=1, checkpoint_every=1, keep_checkpoints=10))
    steps = [("before", 0, 0), ("after", 0, 1, False), ("before", 0, 1), ("after", 0, 2, False), ("end",)]
    assert heard == steps + [(event[0], 1, *event[2:]) if len(event) > 1 else event for event in steps]
    names = sorted(path.name for path in (tmp_path / "out").glob("checkpoint-*.h5"))
    assert names == ["checkpoint-e000-i00000001.h5", "checkpoint-e001-i00000002.h5", "checkpoint-e001-i00000003.h5",
                     "checkpoint-e002-i00000004.h5"]
