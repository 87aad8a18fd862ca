"""Aggregate and per-user decode tokens/s at several concurrencies, AR vs DFlash, through the batching runtime.

    python benchmarks/batching.py [--target DIR --draft DIR] [--concurrency 1,4,16,32] [--max-tokens 64]

A closed loop keeps `concurrency` requests in flight over the prompt set (default: the embedded pair). The AR
and the DFlash engine run side by side, one iteration each in turn, and each is timed by its own clock (the sum
of its iteration times): on a shared, noisy machine both see the same conditions, so their ratio is fair.
"""
from __future__ import annotations

import argparse
import time

import torch

PROMPTS = [f"Write a short Python function number {i} that " + t for i, t in enumerate(
    ["adds two numbers.", "reverses a list.", "counts words in a sentence.", "checks for palindromes.",
     "computes a factorial.", "returns the maximum of a list.", "sorts a dictionary by value.",
     "flattens a nested list."] * 8)]


class ClosedLoop:
    """`concurrency` requests in flight on one engine; time advances only while this engine steps."""

    def __init__(self, llm, prompts, concurrency, max_tokens):
        from dflash_trt import SamplingParams

        self.llm, self.eng, self.c = llm, llm.engine, concurrency
        self.sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        self.todo, self.live, self.done = list(prompts), [], []
        self.clock, self.first, self.last = 0.0, {}, {}

    @property
    def busy(self) -> bool:
        return bool(self.todo or self.live)

    def step(self) -> None:
        while self.todo and len(self.live) < self.c:
            self.live.append(self.llm.add_request(self.todo.pop(0), self.sp, chat=True))
        t0 = time.perf_counter()
        outs = self.eng.step()
        self.clock += time.perf_counter() - t0
        for o in outs:
            self.first.setdefault(o.seq.seq_id, self.clock)
            self.last[o.seq.seq_id] = self.clock
        for s in [s for s in self.live if s.is_finished]:
            self.live.remove(s)
            self.done.append(s)
            self.eng.release(s)

    def figures(self):
        tokens = sum(s.num_output for s in self.done)
        per_user = sum((s.num_output - 1) / max(self.last[s.seq_id] - self.first[s.seq_id], 1e-9)
                       for s in self.done) / len(self.done)
        steps = sum(s.steps for s in self.done)  # speculative steps; tau over them (0: never drafted)
        tau = sum(s.accepted + s.steps for s in self.done) / steps if steps else 0.0
        return tokens / self.clock, per_user, tau


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--concurrency", default="1,4,16,32")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--policy", default="adaptive", help="DFlash draft-length policy: adaptive or fixed")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from dflash_trt import LLM

    if args.target is None:
        from dflash_trt.embedded import embedded_paths
        args.target, args.draft = embedded_paths()
    conc = [int(c) for c in args.concurrency.split(",")]
    prompts = PROMPTS[:args.num_requests]
    ar_llm = LLM(target=args.target, speculative=False, max_batch_size=max(conc))
    sd_llm = LLM(target=args.target, draft=args.draft, speculative=True, max_batch_size=max(conc),
                 draft_len_policy=args.policy)
    c = sd_llm.engine.policy.costs
    print(f"DFlash step costs measured at start (units of a one-row target pass): verify row {c.row:.3f}, "
          f"drafter pass {c.draft:.3f} + {c.draft_row:.3f} per request")
    print(f"{'conc':>4s} {'AR agg':>8s} {'DFlash agg':>10s} {'ratio':>6s} {'AR user':>8s} {'DF user':>8s} "
          f"{'tau':>5s}  (tok/s; each engine on its own clock)")
    ratios, ar_agg = {}, {}
    for c in conc:
        ps = prompts[:max(c, min(len(prompts), 2 * c))]
        ar, sd = ClosedLoop(ar_llm, ps, c, args.max_tokens), ClosedLoop(sd_llm, ps, c, args.max_tokens)
        while ar.busy or sd.busy:
            for run in (ar, sd):
                if run.busy:
                    run.step()
        (a, au, _), (d, du, tau) = ar.figures(), sd.figures()
        ratios[c], ar_agg[c] = d / a, a
        print(f"{c:4d} {a:8.1f} {d:10.1f} {d / a:5.2f}x {au:8.1f} {du:8.1f} {tau:5.2f}", flush=True)
    print(f"DFlash/AR aggregate: {', '.join(f'c={c} {r:.2f}x' for c, r in ratios.items())}")
    print(f"AR scaling: concurrency {max(conc)} vs {min(conc)} = {ar_agg[max(conc)] / ar_agg[min(conc)]:.2f}x")


if __name__ == "__main__":
    main()
