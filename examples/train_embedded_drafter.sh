#!/usr/bin/env bash
# How the embedded SmolLM2-135M-Instruct drafter is made, on a CPU, resumable at every stage:
#   1. self-distillation data: the target answers generated prompts (no evaluation set) through our runtime,
#      greedy, chat template, continuous batching: MAGPIE requests the target writes itself first, then the
#      templated prompts, newest (code stubs, open requests past the first 8000) first
#   2. dflash-train on the data present (features cached once; a restart picks up new full shards)
# Re-running the script resumes where it stopped. The shipped drafter's own history (resumes, schedules, times)
# is in runtime/assets/smollm2-dflash/README.md.
#   DATA_PROMPTS=12000 MAGPIE=2900 STEPS=9000 THREADS=2 bash examples/train_embedded_drafter.sh
# Domain-steered Magpie data alone (the [drafter] run): its 1,082 requests (seed 1) and the answers written so far
# are committed; unpack both to resume where the run stopped instead of resampling (the target's greedy answers
# through our runtime, ~15-35 tokens/s on one shared CPU thread, ~190 tokens per answer):
#   xz -dc builder/data/magpie_domains_seed1.jsonl.xz > /work/data/sd_domains.jsonl.magpie-domains.jsonl
#   xz -dc builder/data/sd_domains_seed1.jsonl.xz > /work/data/sd_domains.jsonl
#   DATA=/work/data/sd_domains.jsonl DATA_PROMPTS=0 MAGPIE=0 MAGPIE_DOMAINS=1082 SEED=1 SKIP_TRAIN=1 THREADS=1 \
#     bash examples/train_embedded_drafter.sh
set -euo pipefail
DATA=${DATA:-/work/data/smollm2_sd.jsonl}
OUT=${OUT:-/work/data/smollm2_dflash_run}
PROMPTS=${DATA_PROMPTS:-12000}
MAGPIE=${MAGPIE:-2900}
MAGPIE_DOMAINS=${MAGPIE_DOMAINS:-0}  # requests written under domain system prompts (magpie.DOMAINS), answered first
STEPS=${STEPS:-9000}
THREADS=${THREADS:-2}
mkdir -p "$(dirname "$DATA")"
if [ "${SKIP_DATA:-0}" != 1 ]; then
  python - <<PY
import torch; torch.set_num_threads($THREADS)
from dflash_trt.embedded import ensure_target
from dflash_trt.builder.training.datagen import generate_data
generate_data(ensure_target(), "$DATA", $PROMPTS, seed=${SEED:-0}, batch=48, newest_first=True, magpie=$MAGPIE,
              magpie_domains=$MAGPIE_DOMAINS)
PY
fi
[ "${SKIP_TRAIN:-0}" = 1 ] && exit 0
export OMP_WAIT_POLICY=PASSIVE  # other jobs on the cores: sleeping, not spinning, OpenMP workers
dflash-train --output "$OUT" --data "$DATA" --block-size 8 --num-layers 3 --target-layer-ids 1 8 14 20 27 \
  --max-steps "$STEPS" --eval-every 1000 --threads "$THREADS" --resume
