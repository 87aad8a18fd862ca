"""Aggregate and per-user decode tokens/s at several concurrencies, AR vs DFlash, through the batching runtime.

    python benchmarks/batching.py [--target DIR --draft DIR] [--concurrency 1,4,16,32] [--max-tokens 64]
        [--dataset humaneval|mtbench] [--fixed-too] [--linear-too] [--ready-too] [--dtype float32|bfloat16]
        [--draft-weights-too FORMAT]

A closed loop keeps `concurrency` requests in flight over the prompt set (default: the embedded pair and short
coding requests decoded to max_tokens; --dataset: that benchmark's prompts, each ending at EOS or max_tokens).
Every level runs --num-requests requests (at least one per slot). With only two waves of requests, how the last
ones happen to line up weighs as much as the steady state the figure is for: AR's requests, all of one length,
finish together, while DFlash's drift apart and leave a tail of part-full steps.
The AR and the DFlash engine (and with --fixed-too a DFlash engine drafting the full K every step, as
TensorRT-LLM does; with --ready-too one that never drafts, what being ready to draft costs; with
--draft-weights-too FORMAT one whose drafter is packed as FORMAT, e.g. auto: as loaded) run side by side,
one iteration each in turn, each timed by its own clock (the sum of its iteration times): on a shared, noisy
machine all see the same conditions, so their ratios are fair.
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

    def __init__(self, llm, prompts, concurrency, max_tokens, ignore_eos=True):
        from dflash_trt import SamplingParams

        self.llm, self.eng, self.c = llm, llm.engine, concurrency
        self.sp = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
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
    ap.add_argument("--fixed-too", action="store_true", help="also run DFlash with the fixed full draft length")
    ap.add_argument("--linear-too", action="store_true",
                    help="also run adaptive DFlash pricing passes by the 1-to-16-row straight line (no cost curve)")
    ap.add_argument("--ready-too", action="store_true",
                    help="also run a DFlash engine that never drafts (draft_len_schedule {1: 0}): the cost of "
                         "capturing features and keeping the drafter's context")
    ap.add_argument("--ar-too", action="store_true",
                    help="also run a second AR engine: the spread between two identical engines (the noise floor of "
                         "a ratio)")
    ap.add_argument("--draft-weights-too", metavar="FORMAT",
                    help="also run DFlash with the drafter packed as FORMAT (draft_weights; auto: the checkpoint's)")
    ap.add_argument("--dataset", default=None, help="humaneval or mtbench prompts (chat template, stop at EOS)")
    ap.add_argument("--dtype", default="float32", help="weights and activations of both engines: float32 or bfloat16")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from dflash_trt import LLM

    if args.target is None:
        from dflash_trt.embedded import embedded_paths
        args.target, args.draft = embedded_paths()
    conc = [int(c) for c in args.concurrency.split(",")]
    prompts = PROMPTS[:args.num_requests]
    if args.dataset:
        from dflash_trt.bench.datasets import load_dataset, select
        reqs, _ = select(load_dataset(args.dataset).requests, args.num_requests)
        prompts = [r.prompt for r in reqs]
    common = dict(target=args.target, max_batch_size=max(conc), dtype=args.dtype)
    engines = {"AR": LLM(speculative=False, **common),
               "DFlash": LLM(draft=args.draft, speculative=True, draft_len_policy=args.policy, **common)}
    if args.fixed_too:
        engines["fixed K"] = LLM(draft=args.draft, speculative=True, draft_len_policy="fixed", **common)
    if args.ar_too:
        engines["AR2"] = LLM(speculative=False, **common)
    if args.ready_too:
        engines["K=0"] = LLM(draft=args.draft, speculative=True, draft_len_schedule={1: 0}, **common)
    if args.draft_weights_too:
        engines[f"draft {args.draft_weights_too}"] = LLM(
            draft=args.draft, speculative=True, draft_len_policy=args.policy, draft_weights=args.draft_weights_too,
            **common)
    c = engines["DFlash"].engine.policy.costs
    if args.linear_too:  # the same measured figures, less the curves
        engines["linear"] = LLM(draft=args.draft, speculative=True, **common,
                                step_costs={"row": c.row, "draft": c.draft, "draft_row": c.draft_row})
    print(f"{args.dtype}; DFlash ({args.policy}) step costs measured at start (units of a pass's fixed cost): "
          f"verify row {c.row:.3f}, drafter pass {c.draft:.3f} + {c.draft_row:.3f} per request; target pass by "
          f"rows {', '.join(f'{n:g}: {v:.2f}' for n, v in c.curve)}; drafter pass by requests "
          f"{', '.join(f'{n:g}: {v:.2f}' for n, v in c.draft_curve)}")
    names = list(engines)
    print(f"{max(args.num_requests, 1)} requests per level (at least one per slot), {args.max_tokens} tokens each")
    print(f"{'conc':>4s} " + " ".join(f"{n + ' agg':>13s}" for n in names) + " " +
          " ".join(f"{n + '/AR':>11s}" for n in names[1:]) + " " + " ".join(f"{n + ' tau':>11s}" for n in names[1:])
          + " " + " ".join(f"{n + ' user':>12s}" for n in names) + "  (tok/s; each engine on its own clock)")
    ratios, ar_agg = {n: {} for n in names}, {}
    for cc in conc:
        ps = (prompts * cc)[:max(cc, len(prompts))]
        loops = {n: ClosedLoop(llm, ps, cc, args.max_tokens, ignore_eos=not args.dataset) for n, llm in engines.items()}
        while any(lp.busy for lp in loops.values()):
            for lp in loops.values():
                if lp.busy:
                    lp.step()
        fig = {n: lp.figures() for n, lp in loops.items()}
        ar_agg[cc] = fig["AR"][0]
        for n in names:
            ratios[n][cc] = fig[n][0] / fig["AR"][0]
        print(f"{cc:4d} " + " ".join(f"{fig[n][0]:13.1f}" for n in names) + " "
              + " ".join(f"{ratios[n][cc]:10.2f}x" for n in names[1:]) + " "
              + " ".join(f"{fig[n][2]:11.2f}" for n in names[1:]) + " "
              + " ".join(f"{fig[n][1]:12.1f}" for n in names), flush=True)
    for n in names[1:]:
        print(f"{n}/AR aggregate: {', '.join(f'c={cc} {r:.2f}x' for cc, r in ratios[n].items())}")
    print(f"AR scaling: concurrency {max(conc)} vs {min(conc)} = {ar_agg[max(conc)] / ar_agg[min(conc)]:.2f}x")

if __name__ == "__main__":
    main()
