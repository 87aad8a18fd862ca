#!/usr/bin/env bash
# Every figure of the embedded pair (SmolLM2-135M-Instruct + the shipped drafter) in one run, for the issue
# notes: tau per dataset and AR vs DFlash per concurrency (dflash-bench), the batching sweep, DFlash against its
# physical limit, peers (HF generate, z-lab reference, llama.cpp), the z-lab equivalence check, quantized targets.
#   bash benchmarks/embedded_report.sh [OUT_DIR] [THREADS]
set -uo pipefail
OUT=${1:-embedded-report}
T=${2:-2}
mkdir -p "$OUT"
export OMP_WAIT_POLICY=PASSIVE
run() { local name=$1; shift; echo "== $name: $*" | tee -a "$OUT/summary.txt"; /usr/bin/time -f "   ($name: %e s)" "$@" \
        > "$OUT/$name.log" 2>&1; tail -n "${TAIL:-25}" "$OUT/$name.log" >> "$OUT/summary.txt"; }
for ds in humaneval mtbench; do
  run "bench_$ds" dflash-bench --dataset "$ds" --concurrency 1,4,16 --num-requests 12 --max-tokens 128 \
      --threads "$T" --output "$OUT/bench_$ds"
done
TAIL=12 run batching python benchmarks/batching.py --concurrency 1,4,16,32 --num-requests 32 --max-tokens 64 --threads "$T"
TAIL=12 run spec_limit python benchmarks/spec_limit.py --max-tokens 128 --threads 1
TAIL=12 run zlab_check python benchmarks/zlab_check.py --max-tokens 64 --threads "$T"
TAIL=14 run peers python benchmarks/peers.py --max-tokens 64 --threads "$T"
echo "done: $OUT/summary.txt"
