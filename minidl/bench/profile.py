"""Where a step's time goes: every Function's forward and backward, timed by operation type; and
what a forward pass keeps for backward (`saved_bytes`).

Timing wraps the `forward` and `backward` of each Function subclass for the duration of the
measurement and restores them after; on a GPU each call synchronizes first, so the figures
are per-operation device times (and the step itself runs slower while profiled). A Function
called inside another one's forward or backward (a fused op composing the unfused ones on the
CPU) is charged to the outer one only, so the shares add up.
"""
import collections
import contextlib
import time

from minidl.autograd import Function, Tensor
from minidl.backend import on_gpu, xp


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _now():
    if on_gpu:
        xp.cuda.Device().synchronize()
    return time.perf_counter()


@contextlib.contextmanager
def op_timer():
    """Yield a dict "Op.forward" -> total seconds, filled while the context is open."""
    totals = collections.defaultdict(float)
    originals = []
    depth = [0]  # timed calls in progress
    for cls in set(_subclasses(Function)):
        for name in ("forward", "backward"):
            if name not in vars(cls):
                continue
            original = vars(cls)[name]
            originals.append((cls, name, original))

            def timed(self, *args, _original=original, _name=name):
                if depth[0]:
                    return _original(self, *args)
                depth[0] += 1
                try:
                    start = _now()
                    result = _original(self, *args)
                    totals[f"{type(self).__name__}.{_name}"] += _now() - start  # an Op's own name
                finally:
                    depth[0] -= 1
                return result
            setattr(cls, name, timed)
    try:
        yield totals
    finally:
        for cls, name, original in originals:
            setattr(cls, name, original)


def print_profile(step, iters):
    """Run `step` iters times under the timer and print each operation's share of the step."""
    with op_timer() as totals:
        start = time.perf_counter()
        for _ in range(iters):
            step()
        total = time.perf_counter() - start
    print(f"{'operation':28}{'ms/step':>10}{'share':>8}")
    for key, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"{key:28}{1e3 * seconds / iters:>10.1f}{100 * seconds / total:>7.1f}%")
    rest = total - sum(totals.values())
    print(f"{'(outside operations)':28}{1e3 * rest / iters:>10.1f}{100 * rest / total:>7.1f}%")


def _root(array):
    while getattr(array, "base", None) is not None:
        array = array.base
    return array


def _arrays(value, seen):
    """The arrays in `value`: itself, its items, or the attributes of an object (a Function nested
    in a fused op, a fused op's batch-norm state), never walking into Tensors (the graph)."""
    if hasattr(value, "nbytes") and hasattr(value, "base"):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _arrays(item, seen)
    elif isinstance(value, dict):
        yield from _arrays(list(value.values()), seen)
    elif hasattr(value, "__dict__") and not isinstance(value, (type, Tensor)) and id(value) not in seen:
        seen[id(value)] = value  # kept, so that its id is not reused
        yield from _arrays([v for k, v in vars(value).items() if k not in ("inputs", "outputs")], seen)


def saved_bytes(output, parameters):
    """Bytes of the distinct buffers that the Functions of `output`'s graph hold for backward, the
    parameters' buffers (the flat buffer they are views of) not counted."""
    excluded = {id(_root(p.data)) for p in parameters}
    functions, pending, buffers, seen = set(), [output.creator], {}, {}
    while pending:
        function = pending.pop()
        if function is None or function in functions:
            continue
        functions.add(function)
        pending.extend(x.creator for x in getattr(function, "inputs", ()))
        for array in _arrays(function, seen):
            root = _root(array)
            if id(root) not in excluded:
                buffers[id(root)] = root.nbytes
    return sum(buffers.values())
