#!/usr/bin/env bash
# The prepared GPU check (DESIGN.md §7): on one GPU, in under 8 minutes, offline, with the
# project NOT installed (PYTHONPATH = the repository), run every GPU test and the kernel and
# step benchmarks, and write OUTDIR/report.json.
#
#     bash tests/gpu_check.sh OUTDIR [EARLIER_GPU_TESTS_JSON]
#
# With an earlier run's gpu_tests.json, the GPU cases that passed there are not run again (a
# rerun after a fix, within the same device budget); they are reported as "passed earlier".
#
# Needs: python3 with NumPy, CuPy (cupy-cuda13x), PyTorch; nvcc for the resource report. No
# pytest: the GPU tests run through tests/kernels/gpu_cases.py, the cases `pytest -m gpu` runs.
#
# Parts, each with its own time limit, log (OUTDIR/<part>.log) and result file; a part that
# fails or runs out of time is recorded as such and the next one still runs:
#   env            10 s   versions, device                              env.json
#   nvcc           30 s   sm_90 compile, registers/spills per kernel    nvcc.json
#   autotune       85 s   every plan (v1, each v2 tile and split) of    autotune.json
#                         every ResNet-50 convolution at batch 256 and
#                         32, bf16: v1 vs v2 per shape and the choice
#   gpu_tests     120 s   the bf16 and CUDA-graph cases first, then     gpu_tests.json
#                         every kernel on every ResNet-50 shape and
#                         every fused plan; stops starting new cases
#                         at 100 s
#   bench_kernels  50 s   python -m minidl.bench kernels (incremental)  bench_kernels.json
#   bench_step     65 s   ResNet-50, batch 256, 224x224, --amp          bench_step.json
#                         --cuda-graph, against PyTorch eager (cuDNN,
#                         bf16 autocast, channels_last)
#   bench_fused    65 s   the same with --fuse (batch norm inside the    bench_fused.json
#                         convolutions; its passes tuned in warm-up)
#   two_ranks      45 s   2 ranks on the one GPU through the MPI        two_ranks.json
#                         backend (CuPy buffers staged through host
#                         memory; NCCL refuses two ranks on a device)
#   report         10 s   everything above in one file                  report.json
# Worst case (every part at its limit) 480 s. The autotuner's cache (MINIDL_CACHE, a temporary
# folder shared by the parts) makes the later parts start tuned. Exit status 0 when every part
# passed.
set -u
OUT=${1:?usage: bash tests/gpu_check.sh OUTDIR [EARLIER_GPU_TESTS_JSON]}
EARLIER=${2:+$(cd "$(dirname "$2")" && pwd)/$(basename "$2")}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-$(mktemp -d)}  # NVRTC output shared by the parts, not left in OUTDIR
MINIDL_CACHE=${MINIDL_CACHE:-$(mktemp -d)}      # the autotuner's choices and the embedded dataset
export CUPY_CACHE_DIR MINIDL_CACHE
: > "$OUT/parts.jsonl"

part() {  # part NAME LIMIT command...: one line of OUTDIR/parts.jsonl, the output in OUTDIR/NAME.log
    local name=$1 limit=$2 start=$SECONDS rc timed_out=false
    shift 2
    echo "== $name (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then timed_out=true; fi
    printf '{"part": "%s", "rc": %d, "timed_out": %s, "seconds": %d, "limit": %d}\n' \
        "$name" "$rc" "$timed_out" "$((SECONDS - start))" "$limit" >> "$OUT/parts.jsonl"
    tail -n 3 "$OUT/$name.log"
}

part env 10 "$PY" - "$OUT/env.json" <<'EOF'
import json, platform, subprocess, sys
info = {"python": sys.version.split()[0], "platform": platform.platform()}
def version(module):
    try:
        return __import__(module).__version__
    except Exception as error:  # noqa: BLE001
        return f"unavailable: {error}"
for module in ("numpy", "cupy", "torch", "mpi4py"):
    info[module] = version(module)
try:
    import cupy
    props = cupy.cuda.runtime.getDeviceProperties(0)
    info.update(device=props["name"].decode(), compute_capability=cupy.cuda.Device(0).compute_capability,
                multiprocessors=props["multiProcessorCount"], memory_gib=round(props["totalGlobalMem"] / 2**30, 1),
                cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(), driver=cupy.cuda.runtime.driverGetVersion())
except Exception as error:  # noqa: BLE001
    info["device"] = f"unavailable: {error}"
try:
    import torch
    info["cudnn"] = torch.backends.cudnn.version()
except Exception:  # noqa: BLE001
    pass
try:
    info["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
except Exception as error:  # noqa: BLE001
    info["nvcc"] = f"unavailable: {error}"
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(info)
EOF

part nvcc 30 "$PY" tests/kernels/nvcc_check.py --json "$OUT/nvcc.json"
part autotune 85 "$PY" -m minidl.bench autotune --batch-sizes 256,32 --modes bf16 --json "$OUT/autotune.json"
part gpu_tests 120 "$PY" tests/kernels/gpu_cases.py --json "$OUT/gpu_tests.json" --seconds 100 \
    ${EARLIER:+--skip-passed "$EARLIER"}
part bench_kernels 50 "$PY" -m minidl.bench kernels --json "$OUT/bench_kernels.json"
for fuse in no-fuse fuse; do
    name=$([ $fuse = fuse ] && echo bench_fused || echo bench_step)
    part $name 65 "$PY" -m minidl.bench step --device gpu --amp --cuda-graph --vs-torch --model resnet50 \
        --batch-size 256 --image-size 224 --warmup 3 --iters 10 --$fuse --json
    tail -n 1 "$OUT/$name.log" > "$OUT/$name.json"  # the step benchmark prints its JSON line last
done
part two_ranks 45 bash tests/gpu_two_ranks.sh "$OUT/two_ranks.json"

part report 10 "$PY" - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name)
    try:
        with open(path) as f:
            return json.load(f)
    except Exception as error:  # noqa: BLE001 - a missing or cut-off file is reported, not fatal
        return {"unavailable": f"{type(error).__name__}: {error}"}
parts = [json.loads(line) for line in open(os.path.join(out, "parts.jsonl")) if line.strip()]
for p in parts:
    if p["rc"] != 0:
        with open(os.path.join(out, p["part"] + ".log"), errors="replace") as f:
            p["log_tail"] = f.read()[-3000:]
report = {"parts": parts, "passed": all(p["rc"] == 0 for p in parts),
          "env": load("env.json"), "nvcc": load("nvcc.json"), "autotune": load("autotune.json"),
          "gpu_tests": load("gpu_tests.json"), "bench_kernels": load("bench_kernels.json"),
          "bench_step": load("bench_step.json"), "bench_fused": load("bench_fused.json"),
          "two_ranks": load("two_ranks.json")}
with open(os.path.join(out, "report.json"), "w") as f:
    json.dump(report, f, indent=1)
tests = report["gpu_tests"].get("counts", report["gpu_tests"])
print("parts:", {p["part"]: p["rc"] for p in parts}, "| gpu tests:", tests)
print("kernel bench summary:", report["bench_kernels"].get("summary", report["bench_kernels"]))
tuned = report["autotune"]
print("autotune:", {k: tuned.get(k) for k in ("tuned", "seconds")},
      "v2 chosen:", sum(r["choice"].startswith("v2") for r in tuned.get("rows", [])), "of", len(tuned.get("rows", [])))
print("two ranks on one GPU:", report["two_ranks"])
keys = ("minidl_img_per_s", "torch_img_per_s", "ratio", "minidl_peak_mb", "torch_peak_mb")
print("step bench (target >= 1.0 PyTorch eager):", {k: report["bench_step"].get(k) for k in keys})
print("step bench --fuse (target >= 1.2, peak <= 1.0):", {k: report["bench_fused"].get(k) for k in keys})
EOF
"$PY" -c "import json,sys; sys.exit(0 if json.load(open('$OUT/report.json'))['passed'] else 1)" 2>/dev/null
