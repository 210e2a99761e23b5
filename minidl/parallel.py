"""CPU parallelism: the batch is split into chunks that threads process side by side.

NumPy releases the GIL inside ufuncs, copies and BLAS calls, so Python threads that each
take a slice of the batch keep every core busy, the elementwise passes (batch norm, ReLU,
im2col) included, which BLAS threading alone never parallelizes. BLAS itself is made
single-threaded: the per-chunk matrices are small, where its own threads cost more than
they give, and two levels of threads would oversubscribe the cores.

Chunks are sized for the cache: an im2col block of about `CHUNK_BYTES` is consumed by the
matrix product while it is still in cache, so the R·S-times larger column matrix of a
convolution never travels to memory. The split depends on the work alone, never on the
thread count, and partial sums are added in chunk order: results are the same bit for bit
whatever the number of threads.

The allocator is told to keep freed memory (see `_keep_freed_memory`).

On a GPU there is nothing to do here: every call is one chunk, the kernels parallelize.
`MINIDL_NUM_THREADS` sets the thread count (default: the cores this process may use).
"""
import ctypes
import ctypes.util
import os
from concurrent.futures import ThreadPoolExecutor

from minidl.backend import on_gpu

CHUNK_BYTES = 2 << 20


def _thread_count():
    wanted = os.environ.get("MINIDL_NUM_THREADS")
    if wanted:
        return max(1, int(wanted))
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
if not on_gpu:
    from threadpoolctl import threadpool_limits
    threadpool_limits(1, user_api="blas")  # numpy's BLAS only; torch's OpenMP is untouched
    _keep_freed_memory()


def _get_pool():
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(num_threads, thread_name_prefix="minidl")
    return _pool


def chunks(count, bytes_per_item):
    """Split range(count) into (start, stop) pieces of about CHUNK_BYTES each."""
    if on_gpu:
        return [(0, count)]
    pieces = min(max(count, 1), max(1, -(-count * bytes_per_item // CHUNK_BYTES)))
    bounds = [count * i // pieces for i in range(pieces + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def run_chunks(function, count, bytes_per_item):
    """Call function(start, stop) over the chunks of range(count) in parallel; return the results."""
    pieces = chunks(count, bytes_per_item)
    if len(pieces) == 1 or num_threads == 1:
        return [function(start, stop) for start, stop in pieces]
    return list(_get_pool().map(lambda bounds: function(*bounds), pieces))


def sum_chunks(function, count, bytes_per_item):
    """The sum over chunks of function(start, stop), added in chunk order."""
    return _sum_in_order(run_chunks(function, count, bytes_per_item))


def _sum_in_order(partials):
    total = partials[0]
    for partial in partials[1:]:
        total += partial
    return total


def map_rows(function, *arrays):
    """Call function(*row_slices) on matching row chunks of arrays that share their first axis
    (outputs are passed in as arrays and written through their slices); return the results."""
    row_bytes = sum(a[0].nbytes if a.ndim > 1 else a.itemsize for a in arrays)

    def chunk(start, stop):
        return function(*(a[start:stop] for a in arrays))

    return run_chunks(chunk, arrays[0].shape[0], row_bytes)


def sum_rows(function, *arrays):
    """The sum, in chunk order, of function(*row_slices) over the row chunks of `arrays`."""
    return _sum_in_order(map_rows(function, *arrays))
