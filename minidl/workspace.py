"""Work arrays that live across calls and steps, private to the thread that asks for them.

The CPU path's per-chunk temporaries (an im2col block, a zero-padded copy of a few images)
have the same sizes in every step. Taken from here they are allocated once: no allocator
call, no page faults on fresh memory, and the zero border of a padded buffer is written once
instead of for every chunk. Each thread has its own arrays, so chunks running side by side
(minidl.parallel) never share one.

A role holds one array per dtype: the next request for the same role in the same thread
returns the same memory (grown when too small), so a caller must be done with it by then.
"""
import threading

from minidl.backend import get_array_module

_local = threading.local()


def _kept():
    if not hasattr(_local, "arrays"):
        _local.arrays = {}
    return _local.arrays


def scratch(role, shape, like):
    """An uninitialized array of `shape`, with the dtype and array module of `like`."""
    xp = get_array_module(like)
    count = 1
    for size in shape:
        count *= size
    key = (role, xp.__name__, like.dtype.str)
    kept = _kept().get(key)
    if kept is None or kept.size < count:
        kept = _kept()[key] = xp.empty(count, dtype=like.dtype)
    return kept[:count].reshape(shape)


def zero_bordered(shape, border, like):
    """An (N, H, W, C) array whose `border` outermost rows and columns are zero and whose inside
    holds whatever its last user wrote there. Kept per image shape: the border is zeroed once."""
    xp = get_array_module(like)
    key = ("bordered", tuple(shape[1:]), border, xp.__name__, like.dtype.str)
    kept = _kept().get(key)
    if kept is None or len(kept) < shape[0]:
        kept = _kept()[key] = xp.zeros(shape, dtype=like.dtype)
    return kept[:shape[0]]
