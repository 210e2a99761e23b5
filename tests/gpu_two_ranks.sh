#!/usr/bin/env bash
# Part of the prepared GPU check (tests/gpu_check.sh): two ranks on the ONE GPU through the MPI
# backend — the multi-process GPU path (CuPy gradient buffers staged through host memory; NCCL
# refuses two ranks on one device) — train one short epoch of resnet20 under --amp on a small
# embedded dataset. Writes RESULT_JSON in every case: the run's summary, or why it failed.
#
#     bash tests/gpu_two_ranks.sh RESULT_JSON [--dry-run]
#
# --dry-run (gpu_check.sh --dry-run): resnet8_w8 on 8x8 images in float32 (--amp needs a GPU),
# 2 ranks over MPI on the CPU, each rank's kernels those of the device in the environment (the
# emulated one: MINIDL_DEVICE_KERNELS).
set -u
RESULT=${1:?usage: bash tests/gpu_two_ranks.sh RESULT_JSON [--dry-run]}
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [ "${2:-}" = --dry-run ]; then
    MODEL=resnet8_w8 SIZE=8 PER_CLASS=2 BATCH=2 AMP=
else
    MODEL=resnet20 SIZE=32 PER_CLASS=16 BATCH=16 AMP=--amp
fi

fail() {  # fail REASON [LOG]: RESULT says why (with the log's end), exit 1
    "$PY" - "$RESULT" "$1" "${2:-}" <<'PYEOF'
import json, sys
result, reason, log = sys.argv[1:]
tail = open(log, errors="replace").read()[-3000:] if log else ""
json.dump({"passed": False, "failed": reason, "log_tail": tail}, open(result, "w"), indent=1)
PYEOF
    echo "two ranks: $1"
    exit 1
}

MPIEXEC=$(command -v mpiexec || true)
[ -n "$MPIEXEC" ] || fail "no mpiexec on this machine: carry the mpich wheel (pip install mpich) to run this part"
"$PY" -c "from minidl.data import make_embedded_dataset; make_embedded_dataset('$WORK/data', \
train_per_class=$PER_CLASS, val_per_class=$(( (PER_CLASS + 3) / 4 )))" > "$WORK/data.log" 2>&1 \
    || fail "the embedded dataset could not be made" "$WORK/data.log"
"$MPIEXEC" -n 2 "$PY" -m mpi4py train.py --data-path "$WORK/data" --model $MODEL -b $BATCH --epochs 1 \
    --train-crop-size $SIZE --val-crop-size $SIZE --val-resize-size $SIZE --augment none --dist-backend mpi $AMP \
    --output-dir "$WORK/run" < /dev/null 2>&1 | tee "$WORK/train.log"
status=${PIPESTATUS[0]}
[ "$status" -eq 0 ] || fail "mpiexec -n 2 train.py exited with status $status" "$WORK/train.log"
[ -f "$WORK/run/summary.json" ] || fail "train.py wrote no summary.json" "$WORK/train.log"
"$PY" - "$WORK/run/summary.json" "$RESULT" <<'PYEOF'
import json, math, sys
summary = json.load(open(sys.argv[1]))
ok = summary["world_size"] == 2 and math.isfinite(summary["train_loss"])
json.dump({**summary, "passed": ok}, open(sys.argv[2], "w"), indent=1)
print({k: summary[k] for k in ("world_size", "global_batch", "train_loss", "val_top1", "wall_time")})
sys.exit(0 if ok else 1)
PYEOF
