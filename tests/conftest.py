"""Shared test setup.

The torch oracles run on tiny tensors: one intra-op thread is faster than a pool that contends
with NumPy and with other jobs on a small machine.
"""
try:
    import torch
except ImportError:  # only the torch-oracle test files need it
    torch = None
else:
    torch.set_num_threads(1)
