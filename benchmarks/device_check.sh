#!/usr/bin/env bash
# The GPU check of issue #11 point 5, in one go, on a lent GPU machine (nothing downloaded, nothing needed beyond
# the repository's working tree and the machine's own python3 with a CUDA torch). With the device tool:
#
#   run(command="bash benchmarks/device_check.sh", timeout_s=540)
#
# (no carry: only the tracked/unignored tree is needed). Steps, each under its own timeout and all together
# under DEVICE_CHECK_BUDGET seconds (default 450, well inside the 600 s a command may run):
#   0. environment: nvidia-smi, torch/CUDA versions; `pip install --no-deps --no-build-isolation -e .` when
#      dflash_trt is not importable (if that fails, the scripts fall back to the repository's folders)
#   1. build the CUDA plugin ops (plugins/build.py JIT build through dflash_ops.load(), nvcc + ninja, cached
#      under $DFLASH_TRT_CACHE); with DEVICE_CHECK_SASS=1 also plugins/check_cuda.sh (SASS for sm_90a/100a/103a)
#   2. python -m dflash_trt.plugins.gpu_check --cases $GPU_CHECK_CASES (checks vs the CPU ops + op timing)
#   3. python benchmarks/gpu_timing.py --json $OUT/gpu_timing.json (model steps at Llama-3.1-8B / Qwen3-8B shapes,
#      random weights, CUDA graphs; plugin ops timing again, folded into its table, without re-checking)
# Logs and results land in $OUT (at most 7 files: env.txt build.log [check_cuda.log] gpu_check.log
# gpu_timing.log gpu_timing.json summary.txt); the last lines printed are gpu_timing's table and the summary.
# Exit status: the number of steps that failed.
# Elsewhere: OUT=/some/dir bash benchmarks/device_check.sh (default OUT: a fresh temporary directory).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
BUDGET="${DEVICE_CHECK_BUDGET:-450}"
export PYTHONUNBUFFERED=1
export DFLASH_TRT_CACHE="${DFLASH_TRT_CACHE:-/tmp/dflash_trt_cache}"
export MAX_JOBS="${MAX_JOBS:-8}"
T0=$(date +%s)
FAILED=0
: >"$OUT/summary.txt"

left() { echo $((BUDGET - ($(date +%s) - T0))); }
cap() {  # seconds for a step: its own cap, or what is left of the budget minus a margin for what follows
  local want=$1 reserve=${2:-0} l
  l=$(($(left) - reserve))
  ((l < want)) && want=$l
  ((want < 10)) && want=10
  echo "$want"
}
step() {  # step NAME LOG TIMEOUT CMD...: run, log, record rc and seconds
  local name=$1 log=$2 limit=$3 s rc
  shift 3
  s=$(date +%s)
  echo "== $name (timeout ${limit}s) =="
  timeout -k 10 "$limit" "$@" >"$OUT/$log" 2>&1
  rc=$?
  local msg="$name: rc=$rc in $(($(date +%s) - s)) s (log $log)"
  ((rc == 124 || rc == 137)) && msg="$msg TIMED OUT"
  ((rc != 0)) && FAILED=$((FAILED + 1))
  echo "$msg" | tee -a "$OUT/summary.txt"
  tail -n "${TAIL_LINES:-4}" "$OUT/$log"
  return $rc
}

{
  date -u
  nvidia-smi 2>&1 | head -20
  "$PY" -c "import torch, sys; print('python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA',
torch.version.cuda, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'NO CUDA DEVICE')" 2>&1
  command -v nvcc && nvcc --version | tail -2
} >"$OUT/env.txt" 2>&1
tail -n 4 "$OUT/env.txt"

if "$PY" -c "import dflash_trt.plugins.gpu_check" >/dev/null 2>&1; then
  GPU_CHECK=("$PY" -m dflash_trt.plugins.gpu_check)
elif "$PY" -m pip install -q --no-deps --no-build-isolation -e . >>"$OUT/env.txt" 2>&1 &&
  "$PY" -c "import dflash_trt.plugins.gpu_check" >/dev/null 2>&1; then
  echo "installed the repository (pip install --no-deps --no-build-isolation -e .)" | tee -a "$OUT/env.txt"
  GPU_CHECK=("$PY" -m dflash_trt.plugins.gpu_check)
else
  echo "dflash_trt not installable here: running the repository's files" | tee -a "$OUT/env.txt"
  GPU_CHECK=("$PY" plugins/gpu_check.py)
fi

# 1. the CUDA ops' JIT build (what gpu_check and the runtime load); keep >= 200 s for steps 2 and 3
step "build plugin ops" build.log "$(cap 180 200)" "$PY" -c "
import time, sys, os
sys.path.insert(0, 'benchmarks')
import gpu_timing  # dflash_trt as installed, else the repository's folders
from dflash_trt.plugins import dflash_ops
t = time.time()
dflash_ops.load()
print(f'built/loaded dflash_ops in {time.time() - t:.1f} s; CUDA kernels: {dflash_ops.has_cuda_kernels()}')
sys.exit(0 if dflash_ops.has_cuda_kernels() else 1)
"
if [ "${DEVICE_CHECK_SASS:-0}" = 1 ]; then
  step "check_cuda.sh (SASS)" check_cuda.log "$(cap 150 200)" bash plugins/check_cuda.sh /tmp/dflash_check_cuda
fi

# 2. the plugin ops' checks and timing; keep >= 170 s for the model timing
step "gpu_check" gpu_check.log "$(cap 150 170)" "${GPU_CHECK[@]}" --cases "${GPU_CHECK_CASES:-100}"

# 3. the model steps (its own budget ends 15 s before ours, so it writes its JSON and table itself)
LIMIT=$(cap 400 0)
TAIL_LINES=80 step "gpu_timing" gpu_timing.log "$LIMIT" "$PY" benchmarks/gpu_timing.py \
  --json "$OUT/gpu_timing.json" --plugin-cases 0 --budget-s $((LIMIT > 60 ? LIMIT - 45 : LIMIT / 2)) \
  ${GPU_TIMING_ARGS:-}

echo "== summary: $FAILED failed step(s), $(($(date +%s) - T0)) s in all; files in $OUT ==" >>"$OUT/summary.txt"
cat "$OUT/summary.txt"
exit "$FAILED"
