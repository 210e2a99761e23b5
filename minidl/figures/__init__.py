"""Pictures drawn by code, from the engine's own constants, plans, traces and schedules:
`python -m minidl.figures [DIR]` redraws every one into DIR (default docs/figures).

Each module draws one subject and reads it from the code that runs it: `gemm` the v2 kernels'
tiles (minidl/kernels/conv_v2.py) and shared-memory swizzle (kernels/conv_v2.cu), `torus` the
2D-torus all-reduce's stages (minidl.distributed.AllReduce on minidl.plan's recording
communicator), `overlap` a traced step's buckets against its backward, `schedule` the sony
recipe's batch size and learning rate (minidl.schedule through minidl.config).

Details: docs/figures/README.md.
"""
