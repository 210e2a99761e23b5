#!/usr/bin/env bash
# Part of the prepared GPU check (tests/gpu_check.sh): two ranks on the ONE GPU through the MPI
# backend — the multi-process GPU path (CuPy gradient buffers staged through host memory; NCCL
# refuses two ranks on one device) — train one short epoch of resnet20 under --amp on a small
# embedded dataset. Writes RESULT_JSON: the run's summary, or why it did not run.
#
#     bash tests/gpu_two_ranks.sh RESULT_JSON
set -u
RESULT=${1:?usage: bash tests/gpu_two_ranks.sh RESULT_JSON}
PY=${PYTHON:-python3}
MPIEXEC=$(command -v mpiexec || true)
WORK=$(mktemp -d)
if [ -z "$MPIEXEC" ]; then
    echo '{"skipped": "no mpiexec on this machine: carry the mpich wheel (pip install mpich) to run this part"}' > "$RESULT"
    cat "$RESULT"; exit 1
fi
"$PY" -c "from minidl.data import make_embedded_dataset; make_embedded_dataset('$WORK/data', train_per_class=16, val_per_class=4)" || exit 1
"$MPIEXEC" -n 2 "$PY" -m mpi4py train.py --data-path "$WORK/data" --model resnet20 -b 16 --epochs 1 \
    --train-crop-size 32 --val-crop-size 32 --val-resize-size 32 --augment none --dist-backend mpi --amp \
    --output-dir "$WORK/run" || exit 1
"$PY" - "$WORK/run/summary.json" "$RESULT" <<'PYEOF'
import json, math, sys
summary = json.load(open(sys.argv[1]))
ok = summary["world_size"] == 2 and math.isfinite(summary["train_loss"])
json.dump({**summary, "passed": ok}, open(sys.argv[2], "w"), indent=1)
print({k: summary[k] for k in ("world_size", "global_batch", "train_loss", "val_top1", "wall_time")})
sys.exit(0 if ok else 1)
PYEOF
