"""`python -m minidl.experiments.large_batch`: error vs global batch, warmup and batch-size control, small.

Goyal et al.'s and Mikami et al.'s questions asked of this engine at a size two CPU cores
answer within hours: error vs k·n and the critical batch B* (with its bootstrap distribution
over seeds), warmup at B* and 2·B*, batch-size control, LARS past B* (also under You et al.'s
protocol, protocol.py), label smoothing on noisy labels. Rows differ in one knob (rows.py); each
run is cached under OUTPUT/runs (an interrupted study resumes, a finished one only redraws) and in
a run store that git carries (store.py); spread.py compares BLAS kernels.

Details: docs/recipe.md, "minidl/experiments/large_batch/__init__.py".
"""

PROG = "python -m minidl.experiments.large_batch"
