"""The asynchronous host -> GPU copy of uint8 batches (CuPy), overlapping the training step.

The loader's batch ring is page-locked (pinned), so a copy from it is a DMA transfer on a
stream of its own while the default stream computes; only uint8 crosses the bus, and
`normalize` makes floats on the device. All ordering is by CUDA events, never by
synchronizing the device; a ring slot goes back to the workers only once its copy is done.

Details: docs/data.md, "minidl/data/device.py".
"""

import warnings


class DeviceCopier:
    """Copies uint8 arrays that live inside `host` (a page-aligned NumPy array) to the GPU."""

    def __init__(self, host):
        import cupy
        self.cupy = cupy
        self.host = host
        self.stream = cupy.cuda.Stream(non_blocking=True)
        try:
            cupy.cuda.runtime.hostRegister(host.ctypes.data, host.nbytes, 0)
            self.pinned = True
        except cupy.cuda.runtime.CUDARuntimeError as e:  # still correct, only not overlapped
            warnings.warn(f"could not pin the loader's batch memory ({e}): host-to-GPU copies "
                          "will not overlap computation")
            self.pinned = False

    def start(self, images):
        """Start copying `images`; return (the device array, an event recorded after the copy).

        Valid for the consumer's stream once `wait(event)` has been called.
        """
        cupy = self.cupy
        device = cupy.empty(images.shape, dtype=images.dtype)
        self.stream.wait_event(cupy.cuda.get_current_stream().record())
        device.set(images, stream=self.stream)
        return device, self.stream.record()

    def wait(self, copied):
        """Order the consumer's stream after the copy, and block until the host may reuse its
        source (by then the copy, started one batch earlier, is normally long done)."""
        self.cupy.cuda.get_current_stream().wait_event(copied)
        copied.synchronize()

    def close(self):
        self.stream.synchronize()  # no copy may still read the ring when it is unmapped
        if self.pinned:
            self.cupy.cuda.runtime.hostUnregister(self.host.ctypes.data)
