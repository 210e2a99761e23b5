"""A training step captured once in a CUDA graph and replayed (`--cuda-graph`): one launch per
step instead of hundreds of launches driven from Python (cupy.cuda.Graph, by stream capture).

`GraphedStep(step, optimizer, images_shape)` runs a whole device step (DeviceStep) eagerly for
the warm-ups, captures the next call, then replays it. A replay sees nothing new, so all that
changes between steps (batch, rate, parameters, sums) lives in device memory at fixed
addresses, and its temporaries in a private memory pool; the step function must keep to the
same kernels and shapes, with no host synchronization, on one process.

Details: docs/training.md, "minidl/training/graph.py".
"""
import contextlib

import numpy

from minidl.backend import xp

WARMUP_STEPS = 2


class CudaCapture:
    """The CUDA side of a GraphedStep: its stream, its private memory pool, capture and launch."""

    def __init__(self):
        import cupy
        self.cupy = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.pool = cupy.cuda.MemoryPool()

    @contextlib.contextmanager
    def running(self):
        """Work inside runs on the capture stream and allocates from the private pool, after the
        caller's stream's work so far; the caller's stream then waits for it."""
        cupy = self.cupy
        caller = cupy.cuda.get_current_stream()
        self.stream.wait_event(caller.record())
        try:
            with self.stream, cupy.cuda.using_allocator(self.pool.malloc):
                yield
        finally:
            caller.wait_event(self.stream.record())

    def capture(self, function):
        """A cupy.cuda.Graph of the work function() queues (function itself runs once, recording)."""
        with self.running():
            self.stream.begin_capture()
            try:
                function()
            finally:  # leave capture mode also when function fails
                graph = self.stream.end_capture()
        return graph

    def launch(self, graph):
        graph.launch(stream=self.cupy.cuda.get_current_stream())


class GraphedStep:
    def __init__(self, step, optimizer, images_shape, warmup=WARMUP_STEPS, cuda=None):
        if not hasattr(optimizer, "stage_step"):
            raise TypeError(f"{type(optimizer).__name__} cannot be replayed from a CUDA graph: its step has no "
                            "device half (stage_step / step_from_device); use SGD")
        self.step, self.optimizer = step, optimizer
        self.images = xp.empty(images_shape, dtype=numpy.uint8)
        self.labels = xp.empty(images_shape[0], dtype=numpy.int64)
        self.warmup_left = warmup
        self.cuda = CudaCapture() if cuda is None else cuda
        self.graph = None

    def __call__(self, images, labels):
        """One step on this batch: uint8 images on the device, integer labels (host or device)."""
        labels = xp.asarray(labels)
        self.optimizer.stage_step()  # the host half: this step's rate into the device scalars
        if images.shape != self.images.shape:
            self.step(images, labels, staged=True)  # not the captured shape: eagerly, outside the graph's pool
            return
        self.images[...] = images
        self.labels[...] = labels
        if self.warmup_left:
            self.warmup_left -= 1
            with self.cuda.running():
                self._staged_step()
        else:
            if self.graph is None:
                self.graph = self.cuda.capture(self._staged_step)
            self.cuda.launch(self.graph)

    def _staged_step(self):
        self.step(self.images, self.labels, staged=True)
