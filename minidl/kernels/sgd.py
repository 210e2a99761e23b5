"""Launcher of kernels/sgd.cu: the fused SGD-momentum update over the flat buffers.

`sgd_momentum_update` takes the rate, the gradient scale and the momentum correction as
launch arguments. A CUDA graph freezes launch arguments at capture, so for a replayed step the
three live in a float32 device array instead: `store_sgd_scalars` writes them there (launched
before each replay) and `sgd_momentum_update_from` reads them there when it runs (what the
graph captures). Both forms are the same arithmetic, exactly as minidl.ops.sgd's reference on
normal numbers (subnormals are flushed to zero: kernels/sgd.cu).
"""
import numpy

from minidl.kernels.launch import Launcher, data_address, pointer, require_float32

FAMILY = "sgd"
THREADS = 256
DEFINES = {"SGD_THREADS": THREADS}
NAMES = ("sgd_momentum<1>", "sgd_momentum<4>", "sgd_momentum_scalars<1>", "sgd_momentum_scalars<4>",
         "sgd_store_scalars")


class SgdKernels(Launcher):
    def _update(self, kernel, w, g, u, decay, arguments):
        """Launch `kernel` on the buffers; `arguments` are its parameters after (w, g, u, decay, n)."""
        require_float32(w, g, u, decay)
        n = w.size
        buffers = [a for a in (w, g, u, decay) if a is not None]
        vector = 4 if n % 4 == 0 and all(data_address(a) % 16 == 0 for a in buffers) else 1
        self.launch(FAMILY, f"{kernel}<{vector}>", self.elementwise_grid(n // vector, THREADS), (THREADS,),
                    (w, g, u, pointer(decay), numpy.int32(n), *arguments))

    def sgd_momentum_update(self, w, g, u, lr, momentum, grad_scale=1.0, decay=None, nesterov=False,
                            rate_inside=False, velocity_scale=1.0):
        """In place on the flat buffers, exactly as minidl.ops.sgd.sgd_momentum_update."""
        self._update("sgd_momentum", w, g, u, decay,
                     (numpy.float32(lr), numpy.float32(momentum), numpy.float32(grad_scale), numpy.int32(bool(nesterov)),
                      numpy.int32(bool(rate_inside)), numpy.float32(velocity_scale)))

    def sgd_momentum_update_from(self, scalars, w, g, u, momentum, decay=None, nesterov=False, rate_inside=False):
        """The same update with lr, grad_scale and velocity_scale read from the float32 device
        array `scalars` when the kernel runs."""
        _check_scalars(scalars)
        self._update("sgd_momentum_scalars", w, g, u, decay,
                     (scalars, numpy.float32(momentum), numpy.int32(bool(nesterov)), numpy.int32(bool(rate_inside))))

    def store_sgd_scalars(self, scalars, lr, grad_scale, velocity_scale):
        """scalars ← (lr, grad_scale, velocity_scale), in stream order (no host synchronization)."""
        _check_scalars(scalars)
        self.launch(FAMILY, "sgd_store_scalars", (1,), (1,),
                    (scalars, numpy.float32(lr), numpy.float32(grad_scale), numpy.float32(velocity_scale)))


def _check_scalars(scalars):
    if scalars.dtype != numpy.float32 or scalars.size != 3:
        raise TypeError("the SGD device scalars are a float32 array of 3 elements: lr, grad_scale, velocity_scale")
