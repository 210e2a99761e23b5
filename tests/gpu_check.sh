#!/usr/bin/env bash
# The prepared GPU check (docs/design.md §7): on one GPU, in under 8 minutes, offline, with the
# project NOT installed (PYTHONPATH = the repository), first what can fault and what never ran,
# then what times, and OUTDIR/report.json at the end.
#
#     bash tests/gpu_check.sh --prepare                 # on the CPU machine, before: the nvcc report
#     bash tests/gpu_check.sh OUTDIR                    # on the GPU machine
#     bash tests/gpu_check.sh OUTDIR --rerun EARLIER    # again, skipping what passed in EARLIER (an OUTDIR)
#     bash tests/gpu_check.sh OUTDIR --dry-run [--break v2|v2-wrong|v3|v3-wrong]   # on the CPU machine, no GPU
#
# Parts, each with its own time limit, log (OUTDIR/<part>.log) and result file, the JSON
# rewritten after every case or row so a part cut short keeps what it did; a part that fails,
# runs out of time or leaves no readable result file gets one saying so ({"failed": rc,
# "timed_out", "log_tail"}) and the next part still runs:
#   env            15 s   versions, device                              env.json
#   nvcc            5 s   the resource report --prepare made (sm_90,    nvcc.json
#                         v3 sm_90a: registers, spills per kernel), copied when
#                         its key is the sources' hash; else "missing/
#                         stale": no device time is spent on nvcc
#   smoke_ptx      17 s   ptx_selftest on the device against the        smoke_ptx.json
#                         emulator's answers (mma, ldmatrix lane maps)
#   smoke_wgmma    15 s   ptx_selftest --suite wgmma (sm_90a: wgmma,    smoke_wgmma.json
#                         mbarriers, the cp.async pipeline) likewise
#   smoke_canary   48 s   every v2 and v3 plan once against v1, in      smoke_canary.json
#                         children a sticky fault may kill
#                         (minidl.kernels.canary)
#   v2_cases       40 s   every v1/v2 plan of every TF32/bf16           v2_cases.json
#                         convolution and of the fused passes, on
#                         ResNet-50's shapes, before anything times them
#   v3_cases       30 s   every v3 plan the canary validated, on the    v3_cases.json
#                         emulator's v3 shapes and ResNet-50's
#   autotune       60 s   every candidate of every ResNet-50            autotune.json
#                         convolution at batch 256 and 32, bf16: its
#                         status, time and error vs v1, the choice
#   gpu_tests      62 s   the bf16 and CUDA-graph cases, fp32           gpu_tests.json
#                         convolutions, batch norm, pooling, loss,
#                         SGD, a whole ResNet-50 step vs the CPU
#   bench_kernels  35 s   python -m minidl.bench kernels (with the      bench_kernels.json
#                         conv ladder v0, v1, v2 on two layers)
#   bench_step     45 s   ResNet-50, batch 256, 224x224, --amp          bench_step.json
#                         --cuda-graph, against PyTorch eager (cuDNN,
#                         bf16 autocast, channels_last); the times
#                         written first, the peak memory after
#   bench_fused    45 s   the same with --fuse                           bench_fused.json
#   two_ranks      30 s   2 ranks on the one GPU through the MPI        two_ranks.json
#                         backend (tests/gpu_two_ranks.sh)
#   report          5 s   everything above in one file                  report.json
# The case runners stop starting new cases 10 s before their part's limit. Worst case, every
# part at its limit and killed 2 s after it: 452 + 14 x 2 = 480 s. If smoke_ptx fails, or the
# canary fails a v2 plan (or fails without saying which), the parts after it run with the v1
# kernels only (MINIDL_AUTOTUNE=0; the v2 and v3 cases launch neither; autotune still reports
# every candidate, with MINIDL_CANARY=0: the later ones not validated, none run) and say so in
# their logs, parts.jsonl and report.json: the window still gives v1 figures, and
# smoke_canary.json the failing plans' errors. smoke_wgmma gates v3 alone: if it fails, the
# canary records every v3 plan unavailable with the reason (--skip v3), none runs anywhere, the v3
# cases are skipped with it, and v1 and v2 go on; a canary that fails v3 plans only leaves v2 on
# too (the failed plans never run: their verdicts are in the cache). The autotuner's cache
# (MINIDL_CACHE, a temporary folder shared by the parts) carries the canary's verdicts and the
# choices to the later parts.
#
# --rerun EARLIER: each part that passed in EARLIER (with the same v1-only state) is not run
# again, its files copied and reported as "passed earlier"; the case parts that failed rerun
# only the cases that did not pass there; env and report always run (this machine, this run).
#
# --dry-run: every part on this CPU machine, the CPU emulator of the kernels standing in for the
# GPU (tests/kernels/emulated_device.py through MINIDL_DEVICE_KERNELS), on tiny shapes, with the
# same file formats and report.json, every limit doubled (the emulator is slower than a GPU):
# ptx_selftest against the emulator itself, the canary and autotune on emulated kernels, the
# gpu cases with --shapes small (the CUDA-graph cases skipped), the kernel benchmark with
# PyTorch on the CPU for cuDNN; the step benchmark (resnet8_w8, 8x8, float32: --amp and
# --cuda-graph need CUDA) and two ranks over MPI on the CPU path (MINIDL_KERNELS=0: a step on the
# emulated kernels takes ~9 s; the gpu cases' whole steps run on them, with the tuner off: tuning
# every layer of those steps on the emulator would take minutes; the tuner runs in autotune).
# The emulator's libraries are built before the first part. --break v2 makes every v2 kernel
# launch kill its process as a sticky fault would (EMULATED_DEVICE_BREAK=v2; v2-wrong: wrong
# results): the run must still finish every part, with v2 failed in the canary and v1 chosen;
# --break v3 (v3-wrong) does it to the v3 kernels: v3 failed in the canary, its cases skipped, v1
# or v2 chosen.
#
# Needs: python3 with NumPy, CuPy (cupy-cuda13x), PyTorch, mpi4py and mpiexec; no nvcc, no
# pytest (the GPU tests run through tests/kernels/gpu_cases.py, the cases `pytest -m gpu` runs).
# The bookkeeping (settings, each part's record, the report) is tests/gpu_check_parts.py.
# Exit status 0 when every part passed, 2 on a usage error.
set -u
USAGE="usage: bash tests/gpu_check.sh OUTDIR [--rerun EARLIER_OUTDIR] [--dry-run [--break v2|v2-wrong|v3|v3-wrong]] | --prepare"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
PREPARED=$ROOT/tests/kernels/nvcc_report.json  # --prepare's output (git-ignored; carried with the tree)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
cd "$ROOT"

usage_error() { echo "gpu_check: $1 ($USAGE)" >&2; exit 2; }

if [ "${1:-}" = --prepare ]; then
    [ $# -eq 1 ] || usage_error "--prepare takes no other argument"
    "$PY" tests/kernels/nvcc_check.py --json "$PREPARED" > /dev/null
    rc=$?
    echo "gpu_check --prepare: $PREPARED (nvcc exit status $rc)"
    exit $rc
fi

OUT= EARLIER= DRY=false BREAK=
while [ $# -gt 0 ]; do
    case $1 in
        --rerun) [ $# -ge 2 ] || usage_error "--rerun needs the earlier OUTDIR"; EARLIER=$2; shift 2 ;;
        --dry-run) DRY=true; shift ;;
        --break) [ $# -ge 2 ] || usage_error "--break needs v2, v2-wrong, v3 or v3-wrong"; BREAK=$2; shift 2 ;;
        -*) usage_error "unknown option $1" ;;
        *) [ -z "$OUT" ] || usage_error "one OUTDIR only (got $OUT and $1)"; OUT=$1; shift ;;
    esac
done
[ -n "$OUT" ] || usage_error "OUTDIR is missing"
case $BREAK in "" | v2 | v2-wrong | v3 | v3-wrong) ;; *) usage_error "--break $BREAK: choose v2, v2-wrong, v3 or v3-wrong" ;; esac
[ -z "$BREAK" ] || $DRY || usage_error "--break injects faults into the emulator: it needs --dry-run"
if [ -n "$EARLIER" ]; then
    [ -f "$EARLIER/parts.jsonl" ] || usage_error "--rerun $EARLIER: no parts.jsonl there (not a gpu_check OUTDIR)"
    EARLIER=$(cd "$EARLIER" && pwd)
fi
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
[ "$OUT" != "$EARLIER" ] || usage_error "--rerun needs another OUTDIR than the earlier one"
CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$(mktemp -d)}  # NVRTC output shared by the parts, not left in OUTDIR
MINIDL_CACHE=${MINIDL_CACHE:-$(mktemp -d)}      # the tuner's verdicts and choices, the embedded dataset
export CUPY_CACHE_DIR MINIDL_CACHE
unset EMULATED_DEVICE_BREAK

if $DRY; then
    SCALE=2 SHAPES=small SELFTEST_DEVICE=emulator TWO_RANKS=--dry-run
    CPU_PATH=(env MINIDL_KERNELS=0)  # a step on the emulated kernels takes ~9 s: the steps run on NumPy
    UNTUNED=(env MINIDL_AUTOTUNE=0)  # tuning each layer of the cases' steps on the emulator: minutes
    AUTOTUNE=(--shapes small --batch-sizes 2 --modes bf16)
    KERNELS=(--shapes small --batch-size 2 --modes bf16 --runs 1 --warmup 0)
    STEP=(--device cpu --vs-torch --model resnet8_w8 --batch-size 2 --image-size 8 --warmup 1 --iters 2)
    export PYTHONPATH="$ROOT/tests/kernels:$PYTHONPATH" MINIDL_DEVICE=cpu MINIDL_DEVICE_KERNELS=emulated_device:device
    [ -z "$BREAK" ] || export EMULATED_DEVICE_BREAK=$BREAK
else
    SCALE=1 SHAPES=resnet50 SELFTEST_DEVICE=gpu TWO_RANKS= CPU_PATH=() UNTUNED=()
    AUTOTUNE=(--batch-sizes 256,32 --modes bf16)
    KERNELS=()
    STEP=(--device gpu --amp --cuda-graph --vs-torch --model resnet50 --batch-size 256 --image-size 224 --warmup 3
          --iters 10)
fi

PARTS=tests/gpu_check_parts.py  # the bookkeeping: settings, records of the parts, the report
"$PY" $PARTS settings "$OUT" "$DRY" "$BREAK" "$EARLIER" || exit 2
: > "$OUT/parts.jsonl"
if $DRY; then
    echo "== emulator build"
    "$PY" -c "import emulated_device; emulated_device.build()" || echo "gpu_check: the emulator build failed" >&2
fi

V1_ONLY=  # the reason, once a smoke part failed
V3_OFF=   # the reason, once the wgmma smoke part failed
V1=()     # the environment of the parts after it: the v1 kernels only
CANARY_OFF=()  # the autotune part's after it

part() {  # part NAME LIMIT RESULT command...: runs it (unless it passed in EARLIER); returns its status
    local name=$1 limit=$(($2 * SCALE)) result=$3 start=$SECONDS rc earlier=false
    shift 3
    if [ -n "$EARLIER" ] && [ "$name" != env ] && [ "$name" != report ] &&
        "$PY" $PARTS passed-earlier "$EARLIER" "$name" "$V1_ONLY"; then
        cp "$EARLIER/$result" "$OUT/$result" 2>/dev/null
        cp "$EARLIER/$name.log" "$OUT/$name.log" 2>/dev/null
        echo "== $name: passed earlier ($EARLIER)"
        earlier=true rc=0
    else
        echo "== $name (limit ${limit}s${V1_ONLY:+, v1 only})"
        { [ -z "$V1_ONLY" ] || echo "v1 only: $V1_ONLY"; } > "$OUT/$name.log"
        timeout --kill-after=2 "$limit" "$@" >> "$OUT/$name.log" 2>&1
        rc=$?
    fi
    "$PY" $PARTS record "$OUT" "$name" "$result" "$rc" "$((SECONDS - start))" "$limit" "$earlier" "$V1_ONLY"
}

earlier_cases() {  # earlier_cases RESULT: "--skip-passed EARLIER/RESULT" where EARLIER has that file
    [ -n "$EARLIER" ] && [ -f "$EARLIER/$1" ] && echo "--skip-passed $EARLIER/$1"
}

part env 15 env.json "$PY" $PARTS env "$OUT/env.json" "$DRY"
part nvcc 5 nvcc.json "$PY" tests/kernels/nvcc_check.py --prepared "$PREPARED" --json "$OUT/nvcc.json"

part smoke_ptx 17 smoke_ptx.json "$PY" tests/kernels/ptx_selftest.py --json "$OUT/smoke_ptx.json" \
    --device $SELFTEST_DEVICE
ptx=$?
part smoke_wgmma 15 smoke_wgmma.json "$PY" tests/kernels/ptx_selftest.py --suite wgmma --device $SELFTEST_DEVICE \
    --json "$OUT/smoke_wgmma.json"
wgmma=$?
if [ $wgmma -ne 0 ]; then
    V3_OFF="the wgmma smoke part failed (ptx_selftest --suite wgmma exit status $wgmma): v3 kernels not run"
    echo "== $V3_OFF"
fi
part smoke_canary 48 smoke_canary.json "$PY" -m minidl.kernels.canary --json "$OUT/smoke_canary.json" \
    --plan-timeout $((15 * SCALE)) ${V3_OFF:+--skip v3 --reason "$V3_OFF"}  # a hanging plan fails alone
canary=$?
failed=$("$PY" $PARTS failed-versions "$OUT/smoke_canary.json")  # the versions of the plans it failed
if [ $ptx -ne 0 ] || { [ $canary -ne 0 ] && [ "$failed" != v3 ]; }; then
    V1_ONLY="the smoke part failed (ptx_selftest exit status $ptx, canary $canary): v2 and v3 kernels not used"
    V1=(env MINIDL_AUTOTUNE=0)
    CANARY_OFF=(env MINIDL_CANARY=0)  # the tuner on, no v2 plan validated (not even by the cache): v1 only
    echo "== $V1_ONLY"
elif [ $canary -ne 0 ]; then
    echo "== the canary failed v3 plans only: those never run (their verdicts are in the cache); v1 and v2 go on"
fi

part v2_cases 40 v2_cases.json ${V1[@]+"${V1[@]}"} "$PY" tests/kernels/gpu_cases.py --group v2 --shapes $SHAPES \
    --json "$OUT/v2_cases.json" --seconds $((30 * SCALE)) ${V1_ONLY:+--v1-only} $(earlier_cases v2_cases.json)
part v3_cases 30 v3_cases.json ${V1[@]+"${V1[@]}"} "$PY" tests/kernels/gpu_cases.py --group v3 --shapes $SHAPES \
    --json "$OUT/v3_cases.json" --seconds $((20 * SCALE)) ${V1_ONLY:+--v1-only} $(earlier_cases v3_cases.json)
# the tuner stays on: it reports every candidate, and the canary's verdicts keep the failed ones from
# running; v1 only, none is validated (reported "not validated"), so none runs
part autotune 60 autotune.json ${CANARY_OFF[@]+"${CANARY_OFF[@]}"} "$PY" -m minidl.bench autotune "${AUTOTUNE[@]}" \
    --json "$OUT/autotune.json"
part gpu_tests 62 gpu_tests.json ${V1[@]+"${V1[@]}"} ${UNTUNED[@]+"${UNTUNED[@]}"} "$PY" tests/kernels/gpu_cases.py \
    --group rest --shapes $SHAPES --json "$OUT/gpu_tests.json" --seconds $((50 * SCALE)) $(earlier_cases gpu_tests.json)
part bench_kernels 35 bench_kernels.json ${V1[@]+"${V1[@]}"} "$PY" -m minidl.bench kernels \
    ${KERNELS[@]+"${KERNELS[@]}"} --json "$OUT/bench_kernels.json"
part bench_step 45 bench_step.json ${V1[@]+"${V1[@]}"} ${CPU_PATH[@]+"${CPU_PATH[@]}"} \
    "$PY" -m minidl.bench step "${STEP[@]}" --no-fuse --json "$OUT/bench_step.json"
part bench_fused 45 bench_fused.json ${V1[@]+"${V1[@]}"} ${CPU_PATH[@]+"${CPU_PATH[@]}"} \
    "$PY" -m minidl.bench step "${STEP[@]}" --fuse --json "$OUT/bench_fused.json"
part two_ranks 30 two_ranks.json ${V1[@]+"${V1[@]}"} ${CPU_PATH[@]+"${CPU_PATH[@]}"} \
    bash tests/gpu_two_ranks.sh "$OUT/two_ranks.json" $TWO_RANKS

part report 5 report.json "$PY" $PARTS report "$OUT" "$V1_ONLY" "$V3_OFF"
"$PY" $PARTS finish "$OUT"
