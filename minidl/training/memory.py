"""A GPU out of memory in a step is the user's to fix: the micro-batch per rank is too large.

`naming_the_batch(micro_batch)` turns CuPy's OutOfMemoryError inside it into one UserError line
that says the per-rank micro-batch, the memory asked for and what the device had, and the fix.
"""
import contextlib
import re

from minidl.errors import UserError

GIB = 1 << 30


def _is_out_of_memory(error):
    return type(error).__name__ == "OutOfMemoryError"  # cupy.cuda.memory's, without importing CuPy on a CPU


def _device_memory():
    """(bytes in use, bytes in all) of the current GPU, or None where it cannot be read."""
    try:
        import cupy
        free, total = cupy.cuda.Device().mem_info
        return total - free, total
    except Exception:  # noqa: BLE001 - the numbers only enrich the message
        return None


def message(micro_batch, error, memory):
    asked = re.search(r"allocating ([\d,]+) bytes", str(error))
    needed = f"{int(asked.group(1).replace(',', '')) / GIB:.2f} GiB more" if asked else "more memory"
    had = f" with {memory[0] / GIB:.1f} of {memory[1] / GIB:.1f} GiB in use" if memory else ""
    return (f"the GPU ran out of memory at a micro-batch of {micro_batch} images per rank: the step asked for "
            f"{needed}{had}; lower -b/--batch-size, or set --max-per-rank-batch to accumulate smaller micro-batches")


@contextlib.contextmanager
def naming_the_batch(micro_batch):
    try:
        yield
    except Exception as error:
        if not _is_out_of_memory(error):
            raise
        raise UserError(message(micro_batch, error, _device_memory())) from None
