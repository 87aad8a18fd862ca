"""Aggregate and per-user decode tokens/s at several concurrencies, AR vs DFlash, through the batching runtime.

    python benchmarks/batching.py [--target DIR --draft DIR] [--concurrency 1,4,16,32] [--max-tokens 64]

A closed loop keeps `concurrency` requests in flight over the prompt set (default: the embedded pair).
"""
from __future__ import annotations

import argparse
import time

import torch

PROMPTS = [f"Write a short Python function number {i} that " + t for i, t in enumerate(
    ["adds two numbers.", "reverses a list.", "counts words in a sentence.", "checks for palindromes.",
     "computes a factorial.", "returns the maximum of a list.", "sorts a dictionary by value.",
     "flattens a nested list."] * 8)]


def run(llm, prompts, concurrency, max_tokens):
    from dflash_trt import SamplingParams

    eng = llm.engine
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    todo, live, done = list(prompts), [], []
    t0 = time.perf_counter()
    while todo or live:
        while todo and len(live) < concurrency:
            live.append(llm.add_request(todo.pop(0), sp, chat=True))
        eng.step()
        for s in [s for s in live if s.is_finished]:
            live.remove(s)
            done.append(s)
            eng.release(s)
    wall = time.perf_counter() - t0
    tokens = sum(s.num_output for s in done)
    per_user = sum((s.num_output - 1) / (s.finish_time - s.first_token_time) for s in done) / len(done)
    tau = sum(s.tau for s in done) / len(done)
    return tokens / wall, per_user, tau


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--concurrency", default="1,4,16,32")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from dflash_trt import LLM

    if args.target is None:
        from dflash_trt.embedded import embedded_paths
        args.target, args.draft = embedded_paths()
    conc = [int(c) for c in args.concurrency.split(",")]
    prompts = PROMPTS[:args.num_requests]
    rows = []
    for mode in ("ar", "dflash"):
        llm = LLM(target=args.target, draft=args.draft if mode == "dflash" else None,
                  speculative=mode == "dflash", max_batch_size=max(conc))
        for c in conc:
            agg, user, tau = run(llm, prompts[:max(c, min(len(prompts), 2 * c))], c, args.max_tokens)
            rows.append((mode, c, agg, user, tau))
            print(f"{mode:7s} concurrency {c:3d}: aggregate {agg:8.1f} tok/s, per user {user:7.1f} tok/s"
                  + (f", tau {tau:.2f}" if mode == "dflash" else ""), flush=True)
    ar = {c: a for m, c, a, _, _ in rows if m == "ar"}
    print("\nconcurrency  DFlash/AR aggregate")
    for m, c, a, _, _ in rows:
        if m == "dflash":
            print(f"{c:11d}  {a / ar[c]:.2f}x")
    print(f"AR scaling: concurrency {max(conc)} vs 1 = {ar[max(conc)] / ar[min(conc)]:.2f}x")


if __name__ == "__main__":
    main()
