"""CPU parallelism: the work is split into chunks that threads process side by side.

NumPy releases the GIL inside ufuncs, copies and BLAS calls, so threads that each take a
slice of the batch keep every core busy; BLAS itself runs single-threaded. Chunks are sized
for the cache (`CHUNK_BYTES`); the split depends on the work alone, never on the thread
count, and partial sums are added in chunk order: results are the same bit for bit whatever
the number of threads (`MINIDL_NUM_THREADS`). On a GPU every call is one chunk.

Details: docs/design.md, "minidl/parallel.py".
"""
import ctypes
import ctypes.util
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from minidl import environment
from minidl.backend import get_array_module, on_gpu
from minidl.intmath import ceil_div, round_up

CHUNK_BYTES = 2 << 20
BALANCE = 2
WIDE_ROW = 256  # elements per row for NumPy's inner loops to run at full speed (elementwise passes)
COLUMN_BLOCK = 16  # matmul's column blocks: multiples of the BLAS kernels' register tile
FLOPS_PER_BLOCK = 64 << 20  # matmul's work per column block: far above a call's overhead


def _thread_count():
    wanted = environment.value("MINIDL_NUM_THREADS")
    if wanted:
        return wanted
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _keep_freed_memory():
    """Make glibc serve arrays up to 32 MiB from its heap and keep freed memory there.

    By default every array over 128 KiB is a fresh mmap: the same activations, allocated
    again each step, page-fault in anew, which costs more than a ReLU over them.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    except (OSError, AttributeError):  # not glibc: keep the allocator's defaults
        pass


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
num_threads = 1 if on_gpu else _thread_count()
_pool = None
_in_chunk = threading.local()  # .active: this thread is running a chunk
if not on_gpu:
    from threadpoolctl import threadpool_limits
    threadpool_limits(1, user_api="blas")  # numpy's BLAS only; torch's OpenMP is untouched
    _keep_freed_memory()


def _get_pool():
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max(1, num_threads - 1), thread_name_prefix="minidl")
    return _pool


def piece_count(count, work_per_item, work_per_piece, min_items=1):
    """How many pieces to cut `count` items into so that each holds about `work_per_piece`
    and at least `min_items` items (at least 1 piece; a multiple of BALANCE where the work
    asks for several and the items allow)."""
    pieces = ceil_div(count * work_per_item, work_per_piece)
    if pieces > 1:
        pieces = round_up(pieces, BALANCE)
    return int(max(1, min(pieces, count // max(min_items, 1))))


def split(count, pieces):
    """range(count) as `pieces` (start, stop) ranges of near-equal length."""
    bounds = [count * i // pieces for i in range(pieces + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def chunks(count, bytes_per_item, chunk_bytes=None, min_items=1):
    """Split range(count) into (start, stop) pieces of about chunk_bytes (CHUNK_BYTES) each,
    and of at least min_items items."""
    if on_gpu:
        return [(0, count)]
    return split(count, piece_count(count, bytes_per_item, chunk_bytes or CHUNK_BYTES, min_items))


def run_all(function, arguments):
    """[function(*a) for a in arguments], the calls spread over the threads."""
    arguments = list(arguments)
    if len(arguments) == 1 or num_threads == 1 or getattr(_in_chunk, "active", False):
        return [function(*a) for a in arguments]
    results = [None] * len(arguments)
    claim = itertools.count()  # next() on it is atomic under the GIL

    def work():
        _in_chunk.active = True
        try:
            for index in claim:
                if index >= len(arguments):
                    return
                results[index] = function(*arguments[index])
        finally:
            _in_chunk.active = False

    helpers = [_get_pool().submit(work) for _ in range(min(num_threads, len(arguments)) - 1)]
    try:
        work()
    finally:  # the helpers may still be writing into shared outputs: wait for them in any case
        for helper in helpers:
            helper.result()
    return results


def run_chunks(function, count, bytes_per_item, chunk_bytes=None):
    """Call function(start, stop) over the chunks of range(count) in parallel; return the results."""
    return run_all(function, chunks(count, bytes_per_item, chunk_bytes))


def sum_in_order(partials):
    total = partials[0]
    for partial in partials[1:]:
        total += partial
    return total


def matmul(a, b, out=None):
    """a @ b for matrices; a large product runs over column blocks of b and out in parallel.
    The blocks depend on the shapes alone (the results do not depend on the thread count)."""
    xp = get_array_module(a)
    if out is None:
        out = xp.empty((a.shape[0], b.shape[1]), dtype=xp.result_type(a, b))
    units = ceil_div(b.shape[1], COLUMN_BLOCK)
    pieces = 1 if on_gpu else piece_count(units, 2 * a.shape[0] * a.shape[1] * COLUMN_BLOCK, FLOPS_PER_BLOCK)
    if pieces == 1:
        return xp.matmul(a, b, out=out)
    blocks = [(COLUMN_BLOCK * start, min(COLUMN_BLOCK * stop, b.shape[1])) for start, stop in split(units, pieces)]
    run_all(lambda start, stop: xp.matmul(a, b[:, start:stop], out=out[:, start:stop]), blocks)
    return out


def map_rows(function, *arrays, chunk_bytes=None):
    """Call function(*row_slices) on matching row chunks of arrays that share their first axis
    (outputs are passed in as arrays and written through their slices); return the results.
    A chunk spans about chunk_bytes (CHUNK_BYTES) of all the arrays together."""
    row_bytes = sum(a[0].nbytes if a.ndim > 1 else a.itemsize for a in arrays)

    def chunk(start, stop):
        return function(*(a[start:stop] for a in arrays))

    return run_chunks(chunk, arrays[0].shape[0], row_bytes, chunk_bytes)


def sum_rows(function, *arrays):
    """The sum, in chunk order, of function(*row_slices) over the row chunks of `arrays`."""
    return sum_in_order(map_rows(function, *arrays))
