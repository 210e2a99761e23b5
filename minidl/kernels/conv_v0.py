"""Launcher of kernels/conv_v0.cu: the naive convolution, one thread per output element.

The first rung of the v0 → v1 → v2 ladder, for reading and for measuring what tiling and tensor
cores buy: fp32 only, run through `ConvKernels` with the plan `PLAN` given explicitly
(`conv_forward(x, w, stride, padding, plan=conv_v0.PLAN)`). It is never among the plans the
autotuner chooses from (`ConvKernels.plans`), so it never runs for a user who did not ask.

Details: docs/kernels.md, "minidl/kernels/conv_v0.py".
"""
import numpy

from minidl.kernels.autotune import Plan
from minidl.kernels.launch import i32

FAMILY = "conv_v0"
THREADS = 256
DEFINES = {"CONV_V0_THREADS": THREADS}
KERNELS = {"conv_fwd": "conv_v0_fwd", "conv_dgrad": "conv_v0_dgrad", "conv_wgrad": "conv_v0_wgrad"}
NAMES = tuple(KERNELS.values())
PLAN = Plan("v0", "one thread per output")


def launch(launcher, conv_pass, geometry, a, b, out):
    """Run pass `conv_pass` ("conv_fwd", "conv_dgrad" or "conv_wgrad") on operands a, b into
    `out`: one thread per element of `out`."""
    for array in (a, b, out):
        if array.dtype != numpy.float32:
            raise TypeError(f"the v0 convolution takes float32 data only, not {array.dtype}: give bf16 to v1 or v2")
    blocks = -(-out.size // THREADS)
    launcher.launch(FAMILY, KERNELS[conv_pass], (blocks,), (THREADS,), (a, b, out, *i32(*geometry)))
    return out
