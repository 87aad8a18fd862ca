"""How close DFlash decoding at concurrency 1 comes to its physical limit, and where the rest of a step goes.

    python benchmarks/spec_limit.py [--target DIR --draft DIR] [--max-tokens 128] [--threads 1] [--k 7]
                                    [--dtype float32|bfloat16] [--weights auto|bf16|int8|w8a8|fp8] [--rounds 2]
                                    [--split]

Times, inside real decoding of the same prompts: the target forward + head (logits, or the greedy head screen) of
an autoregressive step (t_AR), of a verify step over K+1 rows (t_verify), and the drafter forward + draft head
(t_draft). The physical limit of DFlash is tau / (t_draft + t_verify) tokens/s (the two forward passes and
nothing else); the loop's own cost (scheduling, batch building, acceptance, bookkeeping) is what separates the
measured speed from it.
K is fixed (draft_len_policy="fixed") so tau and the step times belong to one draft length.
Beside each step time: its floors (benchmarks/membw.py), the weight bytes the pass reads / the measured read
bandwidth and its FLOPs / the peak rate of the dot products its kernels run (a torch matmul of that kind: fp32,
bf16 for a bf16 model's k-pair panels, int8 for W8A8), at the same thread count.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import membw  # noqa: E402

PROMPTS = ["Write a Python function that returns the n-th Fibonacci number.",
           "Explain how a hash map handles collisions.",
           "Write a function that merges two sorted lists.",
           "Give three reasons to write unit tests."]


class Timed:
    """Wraps a module's forward (or a bound method) and records its wall time per call."""

    def __init__(self, obj, name):
        self.obj, self.name, self.orig = obj, name, getattr(obj, name)
        self.times: list[float] = []
        setattr(obj, name, self)

    def __call__(self, *a, **k):
        t0 = time.perf_counter()
        out = self.orig(*a, **k)
        self.times.append(time.perf_counter() - t0)
        return out


class Heads:
    """The head of a target's step, timed: `logits` and the greedy screen (`greedy_tokens`) on one clock."""

    def __init__(self, target):
        self.times: list[float] = []
        for name in ("logits", "greedy_tokens"):
            clock = Timed(target, name)
            clock.times = self.times


def decode(llm, sp, clocks, prompts=PROMPTS):
    eng, steps = llm.engine, []
    for p in prompts:
        s = llm.add_request(p, sp, chat=True)
        eng.step()  # prefill (and its first token): not decode
        marks = [len(c.times) for c in clocks]
        t0 = time.perf_counter()
        n0 = s.num_output
        while not s.is_finished:
            eng.step()
        steps.append((time.perf_counter() - t0, s.num_output - n0, [c.times[m:] for c, m in zip(clocks, marks)]))
        eng.release(s)
    return steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, help="draft length (default: block_size - 1)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--rounds", type=int, default=2, help="passes over the prompts, AR and DFlash alternating")
    ap.add_argument("--weights", default="auto", help="the target's weights: auto, bf16, int8, w8a8, fp8 (EngineConfig)")
    ap.add_argument("--split", action="store_true", help="also print t_AR and t_verify as forward + head")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from dflash_trt import LLM, SamplingParams
    from dflash_trt.int8_weights import WEIGHTS

    if args.weights not in WEIGHTS:
        raise SystemExit(f"spec_limit: --weights must be one of {', '.join(WEIGHTS)}, got {args.weights!r}")
    from dflash_trt.embedded import embedded_paths

    if args.target is None:
        args.target, shipped = embedded_paths()
        args.draft = args.draft or shipped
    sp = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    engine = {"dtype": args.dtype, "weights": args.weights}
    ar = LLM(target=args.target, speculative=False, **engine)
    kw = {"max_draft_len": args.k} if args.k else {}
    sd = LLM(target=args.target, draft=args.draft, draft_len_policy="fixed", **kw, **engine)
    t_ar_f = Timed(ar.engine.target, "forward")
    t_ar_h = Heads(ar.engine.target)
    t_v_f = Timed(sd.engine.target, "forward")
    t_v_h = Heads(sd.engine.target)
    t_d = Timed(sd.engine.proposer, "propose")  # context write + drafter forward + draft head + batch preparation
    decode(ar, SamplingParams(max_tokens=8, ignore_eos=True), [])  # warm-up
    decode(sd, SamplingParams(max_tokens=8, ignore_eos=True), [])
    # AR and DFlash take turns, one prompt each, so that a shared machine's slow spells fall on both alike
    ar_runs, sd_runs = [], []
    for _ in range(args.rounds):
        for p in PROMPTS:
            ar_runs += decode(ar, sp, [t_ar_f, t_ar_h], [p])
            sd_runs += decode(sd, sp, [t_v_f, t_v_h, t_d], [p])
    med = statistics.median
    wall_ar = sum(w for w, _, _ in ar_runs)
    tok_ar = sum(n for _, n, _ in ar_runs)
    wall_sd = sum(w for w, _, _ in sd_runs)
    tok_sd = sum(n for _, n, _ in sd_runs)
    def forward_and_head(runs):
        # a step's head: its greedy screen, or the logits (or both, where the screen declines): their time per pass
        return (med([t for _, _, c in runs for t in c[0]]),
                sum(t for _, _, c in runs for t in c[1]) / sum(len(c[0]) for _, _, c in runs))

    (fwd_ar, head_ar), (fwd_v, head_v) = forward_and_head(ar_runs), forward_and_head(sd_runs)
    t_ar, t_verify = fwd_ar + head_ar, fwd_v + head_v
    t_draft = med([t for _, _, c in sd_runs for t in c[2]])
    n_steps = sum(len(c[2]) for _, _, c in sd_runs)
    tau = tok_sd / n_steps
    k = sd.engine.max_draft_len
    limit = tau / (t_draft + t_verify)
    tgt, dft = sd.engine.target, sd.engine.proposer.drafter
    tk, dk = membw.dot_kind(tgt, tgt.head_packed), membw.dot_kind(dft, getattr(dft, "vocab_packed", None))
    bw, peak = membw.read_bandwidth(args.threads), membw.peaks((tk, dk), args.threads)
    tb = membw.target_step_bytes(tgt)
    floors = {"ar": (tb, membw.target_block_flops(tgt, 1), tk),
              "verify": (tb, membw.target_block_flops(tgt, k + 1), tk),
              "draft": (membw.drafter_step_bytes(dft, tgt), membw.drafter_block_flops(dft, tgt, dft.block_size, k),
                        dk)}

    def floor(name):
        b, f, kind = floors[name]
        return (f"floor: {b / 1e6:4.0f} MB / BW = {b / bw * 1e3:5.2f} ms, {f / 1e9:5.2f} GFLOP / {kind} peak = "
                f"{f / peak[kind] * 1e3:5.2f} ms")

    print(f"{len(PROMPTS)} prompts x {args.max_tokens} tokens x {args.rounds} rounds, batch 1, {args.threads} thread(s), K={k}, "
          f"{args.dtype}, weights {args.weights}")
    print(f"  read bandwidth {bw / membw.GB:.1f} GB/s (torch.sum over 512 MiB), peak "
          + ", ".join(f"{kind} {r / 1e9:.0f}" for kind, r in peak.items())
          + " GFLOP/s (torch matmuls); attention FLOPs left out of the floors")
    print(f"  t_AR (target forward + head, 1 row)      {t_ar * 1e3:7.1f} ms               {floor('ar')}")
    print(f"  t_verify (target forward + head, {k + 1} rows) {t_verify * 1e3:7.1f} ms  ({t_verify / t_ar:.2f} t_AR)  "
          f"{floor('verify')}")
    if args.split:
        print(f"    forward {fwd_ar * 1e3:.2f} / {fwd_v * 1e3:.2f} ms ({(fwd_v - fwd_ar) * 1e3:+.2f}), "
              f"head {head_ar * 1e3:.2f} / {head_v * 1e3:.2f} ms ({(head_v - head_ar) * 1e3:+.2f}): AR / verify")
    print(f"  t_draft (drafter pass + draft head)      {t_draft * 1e3:7.1f} ms  ({t_draft / t_ar:.2f} t_AR)  "
          f"{floor('draft')}")
    print(f"  tau (tokens per DFlash step)             {tau:7.2f}")
    fa, fv = (membw.floor_s(b, bw, f, peak[kind]) for b, f, kind in (floors["ar"], floors["verify"]))
    print(f"  floor ratio t_verify / t_AR              {fv / fa:7.2f}   (the same ratio of the two floors above)")
    print(f"AR:     {tok_ar / wall_ar:6.1f} tok/s measured, {1 / t_ar:6.1f} tok/s limit 1/t_AR "
          f"({tok_ar / wall_ar * t_ar:.0%} of it)")
    print(f"DFlash: {tok_sd / wall_sd:6.1f} tok/s measured, {limit:6.1f} tok/s limit tau/(t_draft+t_verify) "
          f"({tok_sd / wall_sd / limit:.0%} of it)")
    print(f"DFlash / AR measured {tok_sd / wall_sd / (tok_ar / wall_ar):.2f}x; physical bound "
          f"tau*t_AR/(t_draft+t_verify) = {tau * t_ar / (t_draft + t_verify):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
