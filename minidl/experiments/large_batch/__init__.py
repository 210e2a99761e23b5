"""`python -m minidl.experiments.large_batch`: error vs global batch, warmup and batch-size control, small.

Goyal et al. (2017) train ResNet-50 on k workers of n = 32 images, each with its own batch
norm, at the rate scaled linearly from the small batch's, for the same 90 epochs: the error
stays flat up to a critical batch (8k) and rises beyond it (Fig. 1); without warmup, or with
constant warmup, large batches lose accuracy that gradual warmup keeps (Table 1, Fig. 2).
Mikami et al. (2018) grow the batch during training (batch-size control) and add label
smoothing.

The same three questions on this engine, at a size that two CPU cores answer within hours:
1. final validation error vs k·n from 32 to --max-batch, doubling, gradual warmup, mean ± std
   over --batch-seeds; B*, the largest batch up to which every mean error is at most one std
   above k·n = 32's;
2. no / constant / gradual warmup at B* and 2·B*, against k·n = 32;
3. a fixed 2·B* against B* doubling at --control-epoch; label smoothing at --max-batch.
4. LARS against SGD at 2, 4 and 8·B*, and B* with LARS;
5. label smoothing 0 against 0.1 at B* and 2·B* of data with flipped training labels.
B* also comes as a distribution over bootstrap resamples of the seeds; --parts runs a subset.
Every row has the same epochs, schedule shape and data; only its knob differs (rows.py).
The reference rate is tuned once, at k·n = 32, with --lr-sweep.

Each run is cached under OUTPUT/runs (an interrupted study resumes, a finished one only
redraws); OUTPUT gets results.json, table.md, error-vs-batch.png, warmup.png, control.png, lars.png.
"""

PROG = "python -m minidl.experiments.large_batch"
