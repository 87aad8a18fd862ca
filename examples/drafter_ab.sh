#!/usr/bin/env bash
# [drafter] A/B arms of the training recipe, each continuing the shipped drafter on the committed domain data
# (builder/data/sd_domains_seed1.jsonl.xz: 1,082 of the target's own answers), one thread, one arm after another,
# then one report of every arm (and the shipped drafter) per record kind and on HumanEval / MT-Bench.
# Resumable: an arm resumes from its checkpoint, a finished one is skipped; the arms share one feature cache.
#   OUT=/work/ab STEPS=150 bash examples/drafter_ab.sh       (AUTOCAST=bf16 on a CPU with bf16 hardware; REPORT=0: arms only)
# Cost on a 2-core development CPU (one thread, other jobs beside it): the feature cache ~1 CPU-hour once (283K
# tokens), each arm STEPS x ~3-6 s, the report ~25 min.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/work/ab}
STEPS=${STEPS:-150}
AUTOCAST=${AUTOCAST:-float32}  # bf16 pays only where the CPU has bf16 hardware (AVX512-BF16 / AMX)
SHIP=${SHIP:-$HERE/runtime/assets/smollm2-dflash}
DATA=$OUT/data1082.jsonl
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
mkdir -p "$OUT/features"
[ -f "$DATA" ] || { xz -dc "$HERE/builder/data/sd_domains_seed1.jsonl.xz" > "$DATA.tmp"; \
  cp "$HERE/builder/data/sd_domains_seed1.meta.json" "$DATA.meta.json"; mv "$DATA.tmp" "$DATA"; }
ARMS=()
arm() {
  local name=$1; shift
  local out=$OUT/$name
  ARMS+=("$out")
  [ -f "$out/done" ] && return 0
  mkdir -p "$out"
  [ -e "$out/features" ] || ln -s "$OUT/features" "$out/features"
  dflash-train --output "$out" --data "$DATA" --init-from "$SHIP" --num-layers 3 --target-layer-ids 1 8 14 20 27 \
    --max-steps "$STEPS" --threads 1 --split tasks --eval-every 100000 --save-every 50 --log-every 25 --autocast "$AUTOCAST" --resume "$@" \
    >> "$out/log.txt" 2>&1
  touch "$out/done"
}
arm control --block-size 8 --lr 2e-4
arm dpace   --block-size 8 --lr 2e-4 --loss-weights dpace
arm block5  --block-size 5 --lr 2e-4
arm gamma2  --block-size 8 --lr 2e-4 --gamma 2
arm wsd     --block-size 8 --lr 2e-4 --schedule wsd --decay-frac 0.3
arm lr6e-4  --block-size 8 --lr 6e-4
# every drafter drafts from the same rows: the shipped vocabulary and the tokens of the new data
python - "$SHIP" "${ARMS[@]}" <<'PY'
import json, os, sys
ship = set(json.load(open(os.path.join(sys.argv[1], "draft_vocab.json")))["token_ids"])
for arm in sys.argv[2:]:
    p = os.path.join(arm, "drafter", "draft_vocab.json")
    ids = sorted(ship | set(json.load(open(p))["token_ids"]))
    with open(p + ".tmp", "w") as f:
        json.dump({"note": "the shipped drafter's vocabulary and this run's label tokens", "token_ids": ids}, f)
    os.replace(p + ".tmp", p)
PY
[ "${REPORT:-1}" = 1 ] || exit 0
[ -d "$OUT/trim995" ] || python -m dflash_trt.builder.vocab_trim "$SHIP" --data "$DATA" --coverage 0.995 --output "$OUT/trim995"
DRAFTERS=("$SHIP" "$OUT/trim995")
for a in "${ARMS[@]}"; do DRAFTERS+=("$a/drafter"); done
python "$HERE/benchmarks/drafter_report.py" "${DRAFTERS[@]}" --data "$DATA" --k 4 --threads 1 > "$OUT/report_k4.md"
python "$HERE/benchmarks/drafter_report.py" "${DRAFTERS[@]}" --data "$DATA" --threads 1 > "$OUT/report.md"
