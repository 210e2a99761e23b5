"""A GPU out of memory during a step becomes one line naming the per-rank micro-batch, the memory
asked for and what the device had, and the fix (minidl.training.memory)."""
import pytest

from minidl.errors import UserError
from minidl.training import memory


class OutOfMemoryError(Exception):
    """cupy.cuda.memory.OutOfMemoryError's name and message, without a GPU"""


def test_out_of_memory_names_the_batch_and_the_fix(monkeypatch):
    monkeypatch.setattr(memory, "_device_memory", lambda: (130 * memory.GIB, 140 * memory.GIB))
    with pytest.raises(UserError) as caught:
        with memory.naming_the_batch(64):
            raise OutOfMemoryError("Out of memory allocating 2,147,483,648 bytes (allocated so far: 1,024 bytes).")
    text = str(caught.value)
    assert "\n" not in text and "micro-batch of 64 images per rank" in text and "2.00 GiB more" in text
    assert "130.0 of 140.0 GiB in use" in text and "-b/--batch-size" in text and "--max-per-rank-batch" in text


def test_other_errors_pass_through():
    with pytest.raises(ZeroDivisionError):
        with memory.naming_the_batch(64):
            1 / 0
