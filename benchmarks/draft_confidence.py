"""What cutting drafts at the drafter's doubt (min_draft_confidence) buys at concurrency 1, teacher-forced.

    python benchmarks/draft_confidence.py [DRAFTER] [--dataset humaneval|mtbench|heldout:RUN_DIR] [--num 32]

Walks each answer the way greedy decoding does (each block anchored right after the previous bonus token),
with drafts cut before the first one past the first whose drafter probability is below the threshold, and with
fixed draft lengths for comparison. Speed is tau / step cost in units of an autoregressive step, with the step
costs measured on the 2-core development CPU (spec_limit.py: a verify row ~0.07, a drafter pass ~0.19).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

ROW, DRAFT = 0.07, 0.19


def walk(conf: list[torch.Tensor], correct: list[torch.Tensor], threshold: float, k_max: int):
    """(tau, mean drafts verified per step) along decoding's own anchors, each block cut by the runtime's rule."""
    from dflash_trt.builder.training.trainer import decode_anchors
    from dflash_trt.spec.policy import confident_prefixes

    steps = tokens = rows = 0
    for c, ok in zip(conf, correct):
        keep = torch.tensor(confident_prefixes(c[:, :k_max].flatten().tolist(), [k_max] * c.shape[0], threshold))
        lead = ok[:, :k_max].int().cumprod(1)
        runs = torch.minimum(lead.sum(1), keep)  # accepted drafts among those verified
        visited = decode_anchors(runs)
        steps += len(visited)
        tokens += int(runs[visited].sum()) + len(visited)
        rows += int(keep[visited].sum())
    return tokens / steps, rows / steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drafter", nargs="?", default=None, help="default: the embedded drafter")
    ap.add_argument("--dataset", default="humaneval", help="humaneval | mtbench | heldout:RUN_DIR (dflash-train's "
                                                           "held-out records: its first feature shard)")
    ap.add_argument("--num", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tau_eval import target_answers, teacher_features, to_eos

    from dflash_trt.builder.training.features import load_shard
    from dflash_trt.builder.training.trainer import block_labels, choose_anchors, draft_rows
    from dflash_trt.checkpoint import load_state_dict
    from dflash_trt.config import DraftConfig, TargetConfig
    from dflash_trt.draft_vocab import load_draft_vocab
    from dflash_trt.embedded import ensure_draft, ensure_target
    from dflash_trt.loader import ModelPaths, load_models
    from dflash_trt.models.draft import DFlashDrafter

    target, d = ensure_target(), args.drafter or ensure_draft()
    tcfg = TargetConfig.from_dir(target)
    dcfg = DraftConfig.from_dir(d, num_target_layers=tcfg.num_hidden_layers)
    if args.dataset.startswith("heldout:"):
        seqs = load_shard(os.path.join(args.dataset[8:], "features", "shard_00000.safetensors"))[:args.num]
    else:
        recs = to_eos(target_answers(target, args.dataset, args.num, 256), tcfg.eos_token_ids)
        seqs = teacher_features(target, recs, dcfg.target_layer_ids)
    tmodel, _ = load_models(ModelPaths(target, None), tcfg, None, torch.float32, "cpu")
    embed_w, head_w = tmodel.model.embed_tokens.weight.detach(), tmodel.head_weight.detach()
    drafter = DFlashDrafter(dcfg)
    drafter.load_weights(load_state_dict(d, "drafter"), torch.float32)
    vocab = load_draft_vocab(d, head_w.shape[0])
    vocab = vocab if vocab is not None else torch.arange(head_w.shape[0])
    conf, correct = [], []
    with torch.no_grad():
        for s in seqs:
            anchors = choose_anchors(s["prompt_len"], s["ids"].numel(), 1 << 30, None)
            h = draft_rows(drafter, embed_w, s["ids"], s["features"], anchors)
            p, arg = torch.softmax(h @ head_w[vocab].T * dcfg.output_multiplier, -1).max(-1)
            labels = block_labels(s["ids"], anchors, dcfg.block_size)
            conf.append(p)
            correct.append((vocab[arg] == labels) & (labels != -100))
    k_max = dcfg.block_size - 1
    print(f"{args.dataset}, {len(seqs)} answers, K <= {k_max}; speed = tau / (1 + {ROW} * drafts + {DRAFT})")
    print("| drafts | tau | drafts verified per step | speed vs AR |")
    print("|---|---:|---:|---:|")
    for k in (1, 2, 3, 4, k_max):
        tau, rows = walk(conf, correct, 0.0, k)
        print(f"| fixed K={k} | {tau:.3f} | {rows:.2f} | {tau / (1 + ROW * rows + DRAFT):.3f} |")
    for th in (0.2, 0.3, 0.4, 0.5, 0.6):
        tau, rows = walk(conf, correct, th, k_max)
        print(f"| cut below {th} | {tau:.3f} | {rows:.2f} | {tau / (1 + ROW * rows + DRAFT):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
