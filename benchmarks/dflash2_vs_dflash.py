"""DFlash2 against DFlash with drafters of the same size, on the native runtime: acceptance length (tau) and the
cost of a drafting step, greedy, concurrency 1, fixed draft length, the same prompts.

    python benchmarks/dflash2_vs_dflash.py [--dflash2 DIR] [--dflash DIR] [--target DIR] [--max-tokens 64]

Without --dflash2 the DFlash2 drafter is the DFlash drafter itself written as a DFlash2 checkpoint: identity
convolutions (tap 0 = 1, other taps and kernel projections 0) and zero selector codebooks, so the selector's
score is the unary logit and its path is DFlash's argmax. Its tau then equals DFlash's by construction and the
line measures what the DFlash2 mechanism (two convolutions per layer, the top-k walk) costs per step. No
trained DFlash2 drafter fits a target that runs here (the published ones are for 27B-30B targets).

Prints one line: tau and drafter milliseconds per step for each, and decode milliseconds per output token.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import torch

PROMPTS = ["List three prime numbers and explain why each is prime.",
           "Write a Python function that reverses a string.",
           "What is the capital of France? Answer in one sentence.",
           "Explain what a hash table is to a beginner.",
           "Give me a haiku about the sea.",
           "Summarise the rules of chess in four sentences.",
           "Convert 100 degrees Fahrenheit to Celsius and show the steps.",
           "Name five fruits that are red."]


def as_dflash2(dflash_dir: str, out: str, kernel: int = 2, group: int = 16, rank: int = 32, top_k: int = 16) -> str:
    """The DFlash drafter as an equivalent DFlash2 checkpoint (see the module docstring)."""
    from safetensors.torch import load_file, save_file

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(dflash_dir, "config.json")) as f:
        cfg = json.load(f)
    w = load_file(os.path.join(dflash_dir, "model.safetensors"))
    h, vocab, dtype = cfg["hidden_size"], cfg["vocab_size"], w["fc.weight"].dtype
    for i in range(cfg["num_hidden_layers"]):
        for name in ("attention_conv", "mlp_conv"):
            base = torch.zeros(2, kernel, h, dtype=dtype)
            base[:, 0] = 1
            w[f"layers.{i}.{name}.base_kernel"] = base
            w[f"layers.{i}.{name}.kernel_projection.weight"] = torch.zeros(2 * kernel * (h // group), h, dtype=dtype)
    w["candidate_selector.predecessor_codebook"] = torch.zeros(vocab, rank, dtype=dtype)
    w["candidate_selector.successor_codebook"] = torch.zeros(vocab, rank, dtype=dtype)
    w["candidate_selector.hidden_projection.weight"] = torch.zeros(rank, h, dtype=dtype)
    cfg["architectures"] = ["DFlash2DraftModel"]
    cfg.setdefault("dflash_config", {}).update(conv_kernel_size=kernel, conv_group_size=group, selector_rank=rank,
                                               selector_top_k=top_k)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file(w, os.path.join(out, "model.safetensors"))
    if os.path.isfile(os.path.join(dflash_dir, "draft_vocab.json")):
        shutil.copy(os.path.join(dflash_dir, "draft_vocab.json"), out)
    return out


def measure(target: str, draft: str, prompts: list[str], max_tokens: int) -> dict:
    from dflash_trt import LLM, SamplingParams

    llm = LLM(target=target, draft=draft, draft_len_policy="fixed")
    proposer = llm.engine.proposer
    spent = []
    propose = proposer.propose

    def timed(work, want_confidence=False):
        t0 = time.perf_counter()
        out = propose(work, want_confidence)
        spent.append(time.perf_counter() - t0)
        return out

    proposer.propose = timed
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    llm.generate([prompts[0]], sp, chat=True)  # warm-up
    spent.clear()
    steps = tokens = 0
    t0 = time.perf_counter()
    for p in prompts:  # one at a time: concurrency 1
        o = llm.generate([p], sp, chat=True)[0]
        steps, tokens = steps + o.steps, tokens + len(o.token_ids)
    wall = time.perf_counter() - t0
    return {"name": type(proposer).__name__, "tau": tokens / steps, "draft_ms": 1e3 * sum(spent) / len(spent),
            "ms_per_token": 1e3 * wall / tokens}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument("--dflash", default=None, help="default: the embedded DFlash drafter")
    ap.add_argument("--dflash2", default=None, help="default: --dflash written as an equivalent DFlash2 checkpoint")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from dflash_trt import embedded

    target = args.target or embedded.ensure_target()
    dflash = args.dflash or embedded.DRAFT_DIR
    with tempfile.TemporaryDirectory() as tmp:
        dflash2 = args.dflash2 or as_dflash2(dflash, os.path.join(tmp, "dflash2"))
        a = measure(target, dflash, PROMPTS, args.max_tokens)
        b = measure(target, dflash2, PROMPTS, args.max_tokens)
    print(f"{len(PROMPTS)} prompts x {args.max_tokens} tokens, greedy, K = block - 1: "
          f"DFlash tau {a['tau']:.2f}, drafter {a['draft_ms']:.2f} ms/step, {a['ms_per_token']:.1f} ms/token | "
          f"DFlash2 tau {b['tau']:.2f}, drafter {b['draft_ms']:.2f} ms/step ({b['draft_ms'] / a['draft_ms']:.2f}x), "
          f"{b['ms_per_token']:.1f} ms/token" + ("" if args.dflash2 else " (DFlash2 = DFlash's weights, identity "
                                                  "conv, zero codebooks: same drafts by construction)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
