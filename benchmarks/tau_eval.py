"""Teacher-forced tau of drafters on an evaluation set: compare checkpoints in minutes, not hours.

    python benchmarks/tau_eval.py DRAFTER_DIR [DRAFTER_DIR ...] [--dataset humaneval] [--num 32] [--max-tokens 256]

The target answers the first --num prompts greedily once (our AR path, chat template, EOS ignored as
dflash-bench does; cached under ~/.cache/dflash_trt/tau_eval); then every drafter is scored on that text with
all its blocks teacher-forced at draft length K (block size - 1 unless --k). Two figures:
- decode tau: tokens per step along the anchors greedy decoding at a fixed K visits (each block starts right
  after the previous one's bonus token). The drafts are token-identical to the engine's, so this is what
  `dflash-bench --draft-lens K` measures, without the wall-clock noise;
- uniform tau: 1 + mean accepted drafts over every anchor, the training distribution. It is higher: decoding
  anchors follow a token the drafter got wrong, where the text is harder than average. The prompts are an
EVALUATION set: this script only measures, nothing here feeds training.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile

import torch


def target_answers(target: str, dataset: str, num: int, max_tokens: int) -> list[dict]:
    from dflash_trt.bench import datasets as D
    from dflash_trt.llm import LLM
    from dflash_trt.sampling import SamplingParams

    key = hashlib.sha256(f"{os.path.abspath(target)}|{dataset}|{num}|{max_tokens}".encode()).hexdigest()[:12]
    cache = os.path.join(os.path.expanduser("~"), ".cache", "dflash_trt", "tau_eval", f"{key}.jsonl")
    if os.path.isfile(cache):
        with open(cache) as f:
            return [json.loads(line) for line in f]
    ds = D.load_dataset(dataset)
    chosen, _ = D.select(ds.requests, num)
    llm = LLM(target=target, speculative=False, max_batch_size=16, max_seq_len=2048)
    prompts = [llm.encode(r.prompt, chat=True) for r in chosen]
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = [o.token_ids for o in llm.generate(prompts, sp)]
    recs = [{"id": i, "prompt_ids": list(p), "output_ids": list(o)} for i, (p, o) in enumerate(zip(prompts, outs))]
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    with open(cache + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    os.replace(cache + ".tmp", cache)
    return recs


def to_eos(recs: list[dict], eos_ids) -> list[dict]:
    """Each answer up to and including its first EOS, where the engine (and the z-lab benchmark) stops."""
    eos = set(eos_ids)
    cut = lambda o: next((i + 1 for i, t in enumerate(o) if t in eos), len(o))  # noqa: E731
    return [dict(r, output_ids=r["output_ids"][:cut(r["output_ids"])]) for r in recs]


def teacher_features(target: str, recs: list[dict], layer_ids) -> list[dict]:
    """The target's captured features of each record (one teacher-forced pass), in memory."""
    from dflash_trt.builder.training.features import build_feature_shards, load_shard

    with tempfile.TemporaryDirectory() as tmp:
        paths = build_feature_shards(target, recs, list(layer_ids), tmp, log=lambda *_: None)
        return [s for p in paths for s in load_shard(p)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drafters", nargs="+")
    ap.add_argument("--target", default=None, help="target directory (default: the embedded SmolLM2)")
    ap.add_argument("--dataset", default="humaneval")
    ap.add_argument("--num", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--k", type=int, default=None, help="draft length (default: block size - 1)")
    ap.add_argument("--respect-eos", action="store_true",
                    help="score each answer only up to its first EOS, as the z-lab benchmark stops there")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from dflash_trt.builder.training.trainer import evaluate
    from dflash_trt.checkpoint import load_state_dict
    from dflash_trt.config import DraftConfig, TargetConfig
    from dflash_trt.draft_vocab import load_draft_vocab
    from dflash_trt.embedded import ensure_target
    from dflash_trt.loader import ModelPaths, load_models
    from dflash_trt.models.draft import DFlashDrafter

    target = args.target or ensure_target()
    tcfg = TargetConfig.from_dir(target)
    recs = target_answers(target, args.dataset, args.num, args.max_tokens)
    if args.respect_eos:
        recs = to_eos(recs, tcfg.eos_token_ids)
    tmodel, _ = load_models(ModelPaths(target, None), tcfg, None, torch.float32, "cpu")
    embed_w, head_w = tmodel.model.embed_tokens.weight.detach(), tmodel.head_weight.detach()
    feats: dict[tuple, list[dict]] = {}
    n_tok = sum(len(r["output_ids"]) for r in recs)
    print(f"| drafter | {args.dataset} decode tau (teacher-forced, {len(recs)} prompts, {n_tok} answer tokens"
          f"{', to EOS' if args.respect_eos else ''}) | uniform tau | loss |")
    print("|---|---|---|---|")
    for d in args.drafters:
        dcfg = DraftConfig.from_dir(d, num_target_layers=tcfg.num_hidden_layers)
        layers = tuple(dcfg.target_layer_ids)
        if layers not in feats:
            feats[layers] = teacher_features(target, recs, layers)
        drafter = DFlashDrafter(dcfg)
        drafter.load_weights(load_state_dict(d, "drafter"), torch.float32)
        k = args.k or dcfg.block_size - 1
        vocab = load_draft_vocab(d, head_w.shape[0])  # our runtime drafts from it
        tau, loss, tau_decode = evaluate(drafter, embed_w, head_w, feats[layers], k, anchors_per_seq=1 << 30,
                                         vocab=vocab)
        print(f"| {d} | {tau_decode:.3f} (K={k}) | {tau:.3f} | {loss:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
