"""`GradientReducer`: the all-reduce of the optimizer's flat gradient buffer, overlapped with backward.

The flat buffer is cut into buckets, launched from its end to its start (backward's order), each
as soon as every parameter that overlaps it has its final gradient (counted down by a hook on
each parameter). Buckets and their stages start in the same order on every rank whatever the
timing, and the result is bit for bit that of launching every bucket after backward.

Details: docs/distributed.md, "minidl/distributed/reducer.py".
"""
import functools
import time

from minidl.distributed import watchdog

MEGABYTE = 1 << 20


def bucket_bounds(length, itemsize, bucket_mb, alignment):
    """[(start, stop)] covering range(length), in launch order (last bucket of the buffer first)."""
    if not bucket_mb or bucket_mb <= 0:
        return [(0, length)]
    per_bucket = max(alignment, int(bucket_mb * MEGABYTE / itemsize) // alignment * alignment)
    starts = range(0, length, per_bucket)
    return [(start, min(start + per_bucket, length)) for start in reversed(starts)]


def count_uses(loss, index):
    """{parameter index: how many gradients backward from `loss` will accumulate into it}.

    Walks the graph exactly as Tensor.backward does: every Function reachable through inputs
    that require grad runs once and delivers one gradient per input slot."""
    counts = {}
    if loss.creator is None:
        return {index[id(loss)]: 1} if id(loss) in index else {}
    stack, seen = [loss.creator], set()
    while stack:
        function = stack.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        for x in function.inputs:
            if not x.requires_grad:
                continue
            if x.creator is not None:
                stack.append(x.creator)
            elif id(x) in index:
                counts[index[id(x)]] = counts.get(index[id(x)], 0) + 1
    return counts


class GradientReducer:
    def __init__(self, allreduce, flat, bucket_mb=25.0):
        """Reduce `flat.grad` (an optimizer's FlatParameters) with the AllReduce `allreduce`.
        bucket_mb=None or 0: one bucket, the whole buffer. Installs a grad_hook on every
        parameter of `flat` (remove them with `close()`)."""
        self.allreduce, self.flat = allreduce, flat
        grad = flat.grad
        bounds = bucket_bounds(grad.size, grad.itemsize, bucket_mb, allreduce.alignment)
        self.bounds = bounds  # (start, stop) of each bucket in flat.grad, in launch order
        self.plans = [allreduce.plan(grad[start:stop]) for start, stop in bounds]
        # the buckets each parameter overlaps
        self._buckets_of = [[k for k, (start, stop) in enumerate(bounds) if begin < stop and start < end]
                            for begin, end in flat.segments]
        self._index = {id(p): i for i, p in enumerate(flat.params)}
        self._remaining = None  # per parameter: gradients still to come; None while not armed
        self._missing = self._uncounted()  # per bucket: parameters without their final gradient
        self._launched = 0  # buckets launched so far this step (a prefix of self.plans)
        self.launched_in_backward = 0  # how many of them started before backward returned
        self.launched_at = None
        self.on_final = None
        for i, p in enumerate(flat.params):
            p.grad_hook = functools.partial(self._on_gradient, i)

    @property
    def active(self):
        return self.allreduce.comm.size > 1

    def backward(self, loss):
        """loss.backward(), launching each bucket's reduction as soon as its gradients are final."""
        if self._launched:
            raise RuntimeError("the previous reduction is still in flight: call wait() before the next backward")
        if not self.active:
            loss.backward()
            return
        uses = count_uses(loss, self._index)
        self._remaining = [uses.get(i, 0) for i in range(len(self.flat.params))]
        self._missing = [0] * len(self.plans)
        for i, left in enumerate(self._remaining):
            for k in self._buckets_of[i]:
                self._missing[k] += left > 0
        self._tell_final(range(len(self.plans)))
        self._launch_ready()
        try:
            loss.backward()
        finally:
            self._remaining = None
        self.launched_in_backward = self._launched

    def wait(self):
        """Complete the reduction: flat.grad then holds the SUM over ranks of their gradients."""
        if not self.active:
            return
        not_final = [k for k, missing in enumerate(self._missing) if missing] if self.on_final is not None else []
        self._missing = [0] * len(self.plans)  # backward is over: every gradient is final
        self._tell_final(not_final)
        self._launch_ready()
        self._progress(block=True)
        self._launched, self._missing = 0, self._uncounted()

    def _uncounted(self):
        """_missing before backward(loss) has counted the gradients: every bucket still waits."""
        return [1] * len(self.plans)

    def close(self):
        """Remove the hooks from the parameters."""
        for p in self.flat.params:
            p.grad_hook = None

    def _on_gradient(self, i, tensor):
        if self._remaining is None:  # not inside backward(): the plain path reduces in wait()
            return
        self._remaining[i] -= 1
        if self._remaining[i] < 0:
            raise RuntimeError(f"parameter {i} of shape {tensor.shape} received more gradients than the "
                               "graph held: its bucket may already be in flight")
        if self._remaining[i] == 0:
            for k in self._buckets_of[i]:
                self._missing[k] -= 1
            self._tell_final(self._buckets_of[i])
            self._launch_ready()
        self._progress(block=False)

    def _tell_final(self, buckets):
        """on_final(k) for each of `buckets` whose gradients are final now."""
        if self.on_final is not None:
            for k in buckets:
                if self._missing[k] == 0:
                    self.on_final(k)

    def _launch_ready(self):
        while self._launched < len(self.plans) and self._missing[self._launched] == 0:
            if self._launched == 0:
                self.launched_at = time.perf_counter()
            self.plans[self._launched].begin()
            self._launched += 1

    def _progress(self, block):
        """Start the next stages of the launched buckets as far as completion and the order rule
        allow; with block=True, also run each to its end. Buckets finish only here with
        block=True, in wait(): on a GPU, finishing makes the compute stream wait, which must
        not happen while backward still has work to queue."""
        for k in range(self._launched):
            plan, earlier = self.plans[k], self.plans[k - 1] if k else None
            if block:
                watchdog.doing(f"bucket {k}")
            while plan.ready(block) and plan.stages_left:
                if earlier is not None and earlier.next <= plan.next:
                    break  # the previous bucket must start this stage first
                plan.advance()
            if block:
                plan.finish()
