#!/usr/bin/env bash
# [drafter] The A/B arms of the training recipe, then the winners trained together, then one report.
# Every run continues the shipped drafter on the committed domain data (builder/data/sd_domains_seed1.jsonl.xz,
# the target's own answers to requests it wrote under eight domain system prompts, builder/data/*.meta.json).
#   - arms: STEPS steps each on the first 1,082 records (the A/B of session 10: 400 steps), one thread, one
#     after another: control (exp weights, gamma 4, cosine), dpace, block5, gamma2, wsd, lr6e-4;
#   - winner: D-PACE position weights, cosine, lr 2e-4, WINNER_STEPS steps on every record;
#   - code: the same recipe for CODE_STEPS steps on every record plus the code-stub answers (session 11);
#   - more: the same recipe for MORE_STEPS steps on every committed record, from the shipped drafter (session 12);
#   - the report (REPORT=1): decode tau per domain on the held-out tasks, and on HumanEval / MT-Bench, of the
#     shipped drafter, every arm and the winner.
# Resumable: a run resumes from its checkpoint and a finished one is skipped; all share one feature cache
# (features are keyed by record id, so the winner's data adds shards to the arms' ones).
#   OUT=/work/ab STEPS=400 WINNER_STEPS=800 AUTOCAST=bf16 bash examples/drafter_ab.sh
# ONLY="code" (names separated by spaces) runs and reports only those runs.
# AUTOCAST=bf16 pays only on a CPU with bf16 hardware (AVX512-BF16 / AMX: 1.46x the fp32 step rate there, 9x
# slower without). Cost on the 2-core Xeon of session 10, one thread each: the feature cache ~9 min per 1,000
# records, an arm ~7 min of training plus two held-out evaluations of ~1.5 min, the report ~10 min a drafter.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/work/ab}
STEPS=${STEPS:-400}
WINNER_STEPS=${WINNER_STEPS:-800}
CODE_STEPS=${CODE_STEPS:-350}
AUTOCAST=${AUTOCAST:-float32}
SHIP=${SHIP:-$HERE/runtime/assets/smollm2-dflash}
ALL=$OUT/data_all.jsonl   # every committed record
AB=$OUT/data1082.jsonl    # the first 1,082: the arms' data
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
mkdir -p "$OUT/features"
if [ ! -f "$ALL" ]; then  # the 2,082 records of session 10 (the file grew after)
  xz -dc "$HERE/builder/data/sd_domains_seed1.jsonl.xz" | sed -n "1,2082p" > "$ALL.tmp"
  cp "$HERE/builder/data/sd_domains_seed1.meta.json" "$ALL.meta.json"
  mv "$ALL.tmp" "$ALL"
fi
[ -f "$AB" ] || { head -n 1082 "$ALL" > "$AB.tmp"; cp "$ALL.meta.json" "$AB.meta.json"; mv "$AB.tmp" "$AB"; }
RUNS=()
train() {  # name data steps args...
  local name=$1 data=$2 steps=$3; shift 3
  local out=$OUT/$name
  [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]] && return 0
  RUNS+=("$out")
  [ -f "$out/done" ] && return 0
  mkdir -p "$out"
  [ -e "$out/features" ] || ln -s "$OUT/features" "$out/features"
  dflash-train --output "$out" --data "$data" --init-from "$SHIP" --num-layers 3 --target-layer-ids 1 8 14 20 27 \
    --max-steps "$steps" --threads 1 --split tasks --save-every 50 --log-every 25 --autocast "$AUTOCAST" \
    --resume "$@" >> "$out/log.txt" 2>&1
  touch "$out/done"
}
train control "$AB" "$STEPS" --block-size 8 --lr 2e-4 --eval-every 100000
train dpace   "$AB" "$STEPS" --block-size 8 --lr 2e-4 --eval-every 100000 --loss-weights dpace
train block5  "$AB" "$STEPS" --block-size 5 --lr 2e-4 --eval-every 100000
train gamma2  "$AB" "$STEPS" --block-size 8 --lr 2e-4 --eval-every 100000 --gamma 2
train wsd     "$AB" "$STEPS" --block-size 8 --lr 2e-4 --eval-every 100000 --schedule wsd --decay-frac 0.3
train lr6e-4  "$AB" "$STEPS" --block-size 8 --lr 6e-4 --eval-every 100000
train winner  "$ALL" "$WINNER_STEPS" --block-size 8 --lr 2e-4 --eval-every 300 --loss-weights dpace
# session 11: the shipped drafter (the winner) continued on the domain answers plus the target's answers to
# HumanEval-shaped function stubs (builder/data/code_stubs_seed1.jsonl.xz, `dflash-train --code-stubs N`)
CODE=$OUT/data_code.jsonl
if [ ! -f "$CODE" ]; then
  { cat "$ALL"; xz -dc "$HERE/builder/data/code_stubs_seed1.jsonl.xz" | sed -n "1,614p"; } > "$CODE.tmp"
  cp "$ALL.meta.json" "$CODE.meta.json"
  mv "$CODE.tmp" "$CODE"
fi
train code    "$CODE" "$CODE_STEPS" --block-size 8 --lr 2e-4 --eval-every 350 --loss-weights dpace
# session 12: the shipped drafter (code) continued the same way on every committed record: 2,682 domain answers
# and 1,014 stub answers (600 and 400 more than before)
MORE=$OUT/data_more.jsonl
if [ ! -f "$MORE" ]; then
  { xz -dc "$HERE/builder/data/sd_domains_seed1.jsonl.xz"; xz -dc "$HERE/builder/data/code_stubs_seed1.jsonl.xz"; } \
    > "$MORE.tmp"
  cp "$ALL.meta.json" "$MORE.meta.json"
  mv "$MORE.tmp" "$MORE"
fi
train more    "$MORE" "${MORE_STEPS:-350}" --block-size 8 --lr 2e-4 --eval-every 350 --loss-weights dpace
[ "${REPORT:-1}" = 1 ] || exit 0
# every drafter drafts from the same rows: the shipped vocabulary and the tokens of the new data
python - "$SHIP" "${RUNS[@]}" <<'PY'
import json, os, sys
ship = set(json.load(open(os.path.join(sys.argv[1], "draft_vocab.json")))["token_ids"])
for run in sys.argv[2:]:
    p = os.path.join(run, "drafter", "draft_vocab.json")
    ids = sorted(ship | set(json.load(open(p))["token_ids"]))
    with open(p + ".tmp", "w") as f:
        json.dump({"note": "the shipped drafter's vocabulary and this run's label tokens", "token_ids": ids}, f)
    os.replace(p + ".tmp", p)
PY
DRAFTERS=("$SHIP")
for r in "${RUNS[@]}"; do DRAFTERS+=("$r/drafter"); done
python "$HERE/benchmarks/drafter_report.py" "${DRAFTERS[@]}" --data "${REPORT_DATA:-$AB}" --threads 1 > "$OUT/report.md"
