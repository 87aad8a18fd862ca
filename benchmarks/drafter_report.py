"""Decode tau of drafters per record kind on dflash-train's held-out set, and on HumanEval / MT-Bench.

    python benchmarks/drafter_report.py DRAFTER [DRAFTER ...] --data DATA.jsonl [--run RUN_DIR] [--k K]
           [--per-kind N] [--num 32] [--max-tokens 256] [--policy] [--target DIR]

The held-out set is the one dflash-train holds out of DATA (builder/training/split.py: whole tasks, every kind;
with --run, by that run's recorded split.json). Each held-out answer is the target's own, to its EOS; every
block is teacher-forced at draft length K (block size - 1 unless --k) with the drafter's draft vocabulary, as
the runtime drafts. Per kind, and per family (code / chat / maths / magpie):
- decode tau: tokens per step along the anchors greedy decoding visits at that fixed K (what
  `dflash-bench --draft-lens K` measures at concurrency 1, without its wall-clock noise);
- uniform tau: 1 + mean accepted drafts over every anchor, the training distribution (higher).
HumanEval and MT-Bench (first turns): the target's greedy answers to the first --num prompts, to EOS, scored the
same way (benchmarks/tau_eval.py's cache and functions). --policy adds, for those two, tau as the runtime
measures it decoding each prompt alone with its default policy (adaptive draft length, draft confidence cut):
fewer drafts per step, so lower than fixed-K tau yet faster; its speed against autoregressive decoding is what
`dflash-bench --concurrency 1 --respect-eos` measures.

A drafter trained before the held-out split existed (the shipped one, trained with the first 64 records held out)
has seen the templated tasks of this held-out set, and possibly its records: its rows for templated kinds
overstate; records it never saw (Magpie requests steered by domains, prompts past its data) do not.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def held_out(data: str, run: str | None, per_kind: int | None, vocab_size: int, every: bool = False) -> list[dict]:
    from dflash_trt.builder.training.features import read_records
    from dflash_trt.builder.training.split import record_hash, split_records

    fractions = None
    if run:
        with open(os.path.join(run, "split.json")) as f:
            rule = json.load(f)
        if rule["rule"] != "tasks":
            raise SystemExit(f"error: {run} holds out its first records (--split first): no per-kind held-out set")
        fractions = rule.get("fractions")
    records = read_records(data, vocab_size)
    held = records if every else split_records(records, fractions)[0]
    if per_kind:
        by_kind: dict[str, list[dict]] = {}
        for r in sorted(held, key=record_hash):
            by_kind.setdefault(r.get("kind") or "-", []).append(r)
        held = [r for rs in by_kind.values() for r in rs[:per_kind]]
    return held


def policy_tau(target: str, drafter: str, recs: list[dict], max_tokens: int) -> tuple[float, float, float]:
    """(tokens per decoding step, drafts verified per decoding step, output tokens/s) decoding each prompt alone
    with the runtime's default policy, greedy, to EOS. Counted from the tokens and the accepted drafts: a step
    commits its accepted drafts plus one token whether or not it drafted (the first token is the prefill's), so
    steps the policy leaves undrafted count too."""
    from dflash_trt import LLM, SamplingParams

    llm = LLM(target=target, draft=drafter, max_batch_size=1)
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    decoded = accepted = drafted = tokens = 0
    t0 = time.time()
    for r in recs:
        o = llm.generate([r["prompt_ids"]], sp)[0]
        decoded, accepted, drafted = decoded + len(o.token_ids) - 1, accepted + o.accepted, drafted + o.drafted
        tokens += len(o.token_ids)
    steps = max(decoded - accepted, 1)
    return decoded / steps, drafted / steps, tokens / (time.time() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drafters", nargs="+")
    ap.add_argument("--data", required=True, help="the JSONL dflash-train trains on (or more of the same: the "
                                                  "held-out groups are fixed as data grows)")
    ap.add_argument("--run", help="a dflash-train OUTPUT: hold out by its split.json")
    ap.add_argument("--target", help="target directory (default: the embedded SmolLM2)")
    ap.add_argument("--k", type=int, help="draft length (default: block size - 1)")
    ap.add_argument("--all", action="store_true", help="score every record of DATA, not only the held-out ones: "
                                                      "for drafters that never trained on DATA")
    ap.add_argument("--per-kind", type=int, help="at most N held-out records per kind (record-hash order)")
    ap.add_argument("--num", type=int, default=32, help="HumanEval / MT-Bench prompts")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--no-bench", action="store_true", help="the held-out set only")
    ap.add_argument("--policy", action="store_true", help="also decode HumanEval / MT-Bench with the runtime's "
                                                          "default policy (minutes per drafter)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from tau_eval import target_answers, teacher_features, to_eos

    from dflash_trt.builder.training.split import family
    from dflash_trt.builder.training.trainer import evaluate_counts, taus
    from dflash_trt.checkpoint import load_state_dict
    from dflash_trt.config import DraftConfig, TargetConfig
    from dflash_trt.draft_vocab import load_draft_vocab
    from dflash_trt.embedded import ensure_target
    from dflash_trt.loader import ModelPaths, load_models
    from dflash_trt.models.draft import DFlashDrafter

    target = args.target or ensure_target()
    tcfg = TargetConfig.from_dir(target)
    groups: dict[tuple[str, str], list[dict]] = {}  # (section, row) -> records
    section = "data (all)" if args.all else "held out"
    for r in held_out(args.data, args.run, args.per_kind, tcfg.vocab_size, args.all):
        kind = r.get("kind") or "-"
        groups.setdefault((section, f"{family(kind)} / {kind}"), []).append(r)
        groups.setdefault((section, f"{family(kind)} (all)"), []).append(r)
    if not groups:
        raise SystemExit(f"error: {args.data} has no held-out record")
    groups[(section, "all")] = [r for (s, row), rs in groups.items() if row.endswith("(all)") for r in rs]
    for fam in {row.split(" ")[0] for _, row in groups}:  # a family of one kind needs no total of its own
        if sum(row.startswith(fam + " / ") for _, row in groups) == 1:
            del groups[(section, f"{fam} (all)")]
    bench = {}
    if not args.no_bench:
        for ds in ("humaneval", "mtbench"):
            bench[ds] = to_eos(target_answers(target, ds, args.num, args.max_tokens), tcfg.eos_token_ids)
            groups[("eval set", f"{ds} (first {args.num}, to EOS)")] = bench[ds]

    tmodel, _ = load_models(ModelPaths(target, None), tcfg, None, torch.float32, "cpu")
    embed_w, head_w = tmodel.model.embed_tokens.weight.detach(), tmodel.head_weight.detach()
    feats: dict[tuple, dict[int, dict]] = {}  # layer ids -> id(record) -> features
    for d in args.drafters:
        dcfg = DraftConfig.from_dir(d, num_target_layers=tcfg.num_hidden_layers)
        layers = tuple(dcfg.target_layer_ids)
        if layers not in feats:
            uniq = {id(r): r for rs in groups.values() for r in rs}
            recs = [dict(r, id=i) for i, r in enumerate(uniq.values())]
            seqs = teacher_features(target, recs, layers)
            feats[layers] = {key: s for key, s in zip(uniq, seqs)}
        drafter = DFlashDrafter(dcfg)
        drafter.load_weights(load_state_dict(d, "drafter"), torch.float32)
        k = args.k or dcfg.block_size - 1
        vocab = load_draft_vocab(d, head_w.shape[0])  # our runtime drafts from it
        print(f"\n{d} (K = {k}, teacher-forced, greedy)\n")
        print("| set | kind | records | answer tokens | decode tau | uniform tau |")
        print("|---|---|---:|---:|---:|---:|")
        # each record scored once, whatever rows it counts in; the full-head loss is not printed: skipped
        order = list(feats[layers])
        counts = dict(zip(order, evaluate_counts(drafter, embed_w, head_w, [feats[layers][key] for key in order], k,
                                                 anchors_per_seq=1 << 30, vocab=vocab, loss=vocab is None)))
        for (section, row), rs in sorted(groups.items(), key=lambda x: (x[0][0] == "eval set", x[0][1] == "all",
                                                                       x[0][1])):
            tau, _, tau_decode = taus([counts[id(r)] for r in rs])
            n_tok = sum(len(r["output_ids"]) for r in rs)
            print(f"| {section} | {row} | {len(rs)} | {n_tok} | {tau_decode:.3f} | {tau:.3f} |", flush=True)
        if args.policy:
            for ds, rs in bench.items():
                tau, per_step, tps = policy_tau(target, d, rs, args.max_tokens)
                print(f"| runtime policy | {ds} (first {args.num}, to EOS, alone) | {len(rs)} | - | {tau:.3f} "
                      f"({per_step:.2f} drafts verified per step, {tps:.1f} tokens/s) | - |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
