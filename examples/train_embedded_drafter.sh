#!/usr/bin/env bash
# How the embedded SmolLM2-135M-Instruct drafter is made, on a CPU, resumable at every stage:
#   1. self-distillation data: the target answers 8000 generated prompts (no evaluation set) through our runtime
#   2. dflash-train in 30-minute sessions, each picking up the data generated so far (features cached once)
# Re-running the script resumes where it stopped.
set -euo pipefail
DATA=${DATA:-/work/data/smollm2_sd.jsonl}
OUT=${OUT:-/work/data/smollm2_dflash_run}
mkdir -p "$(dirname "$DATA")"
python - <<PY &
import torch; torch.set_num_threads(1)
from dflash_trt.embedded import ensure_target
from dflash_trt.builder.training.datagen import generate_data
generate_data(ensure_target(), "$DATA", 8000, seed=0, batch=48)
PY
until [ -s "$DATA" ] && [ "$(wc -l < "$DATA")" -ge 256 ]; do sleep 60; done
while true; do
  dflash-train --output "$OUT" --data "$DATA" --block-size 8 --num-layers 3 --target-layer-ids 1 8 14 20 27 \
    --max-steps 12000 --session-minutes 30 --eval-every 250 --threads 1 --resume || exit 1
  python -c "import json,sys; h=json.load(open('$OUT/checkpoint/history.json')); sys.exit(0 if h[-1]['step']<12000 else 1)" || break
done
