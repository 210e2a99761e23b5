"""A training step captured once in a CUDA graph and replayed (`--cuda-graph`): one launch per
step instead of hundreds of launches driven from Python (cupy.cuda.Graph, by stream capture).

`GraphedStep(step, optimizer, images_shape)` wraps `step(images, labels, staged=True)`, a
function that does one whole training step on the device (minidl.training.device_step.DeviceStep:
zero the gradients, forward, loss, backward, the update as the device half of the optimizer's
step), and runs it:

    calls 1 .. warmup   eagerly, on the capture stream, allocating from the graph's own pool;
    the next call       captured (the stream records the kernels instead of running them), then
                        launched;
    later calls         launched: the recorded kernels run again with the recorded arguments.
Every call runs the same kernels, the warm-ups included (the update reads its scalars from the
device in all of them), so the warm-ups leave nothing to load or compile during the capture.
Before each call the optimizer's host half (`stage_step`) stages this step's rate.

A replay sees nothing new, so all that changes between steps lives in device memory at fixed
addresses:
- the batch: copied into the static buffers `images`, `labels` before each call (a batch of
  another shape, shortened by undecodable images, runs eagerly instead);
- the rate, gradient scale and momentum correction: the SGD kernel reads them from the
  optimizer's `device_scalars`, which `optimizer.stage_step()` fills before each replay: a
  changed rate needs no new capture;
- parameters, gradients, momentum, BN statistics and the device loss sum: updated in place,
  never reallocated (the optimizer's flat buffers, the modules' buffers, DeviceStep's sums).

Memory: a replay writes its temporaries where the capture's allocations were. Those blocks go
back to the pool during the capture, so they come from a private CuPy pool that nothing else
allocates from afterwards, kept alive by this object. The warm-up calls allocate the same
sequence from the same pool on the same stream first, so the capture finds every block cached
(CuPy's pool keeps free blocks per stream), and they do what must not happen during a capture:
compile and load the kernels, set kernel attributes. No cuBLAS call may be captured (CuPy
refuses it), so the classifier runs on the convolution kernels (minidl.ops.linear).

Synchronization: none on the host. The capture stream waits for the caller's stream (which
wrote the static inputs) by an event, and the caller's stream waits for it afterwards; replays
are launched on the caller's stream itself.

What the step function must keep to: no host synchronization or host-to-device copy inside
(`float(array)`, `xp.asarray(host values)`), the same kernels and shapes on every call, no
randomness drawn on the host, one process (a multi-rank all-reduce is not captured: the trainer
runs those eagerly), an optimizer with a device half of its step (SGD; LARS has none).
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
