"""How much the draft-length policy's cost calibration moves between engine starts on this machine.

    python benchmarks/calibration_spread.py [--target DIR --draft DIR] [--times 6] [--threads 2] [--dtype float32]

Runs `spec/calibrate.measure_step_costs` several times in one process (as every engine start does once). It
prints each run's curves (target pass by rows, drafter pass by requests, in units of a pass's fixed cost) and the
K the policy would choose at 4 requests for per-position acceptance 0.6, 0.7 and 0.8. Where the K changes from
run to run, the machine's noise, not the traffic, decides whether a batch drafts.
"""
from __future__ import annotations

import argparse
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--times", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from dflash_trt import LLM
    from dflash_trt.embedded import embedded_paths
    from dflash_trt.spec.calibrate import measure_step_costs
    from dflash_trt.spec.policy import MARGIN, StepCosts, best_draft_len

    if args.target is None:
        args.target, shipped = embedded_paths()
        args.draft = args.draft or shipped
    eng = LLM(target=args.target, draft=args.draft, dtype=args.dtype).engine
    k_max = eng.max_draft_len
    print(f"{args.times} calibrations, {args.threads} threads, {args.dtype}; T: target pass by rows, D: drafter pass "
          f"by requests; K at 4 requests for p = 0.6 / 0.7 / 0.8 (K max {k_max})")
    for _ in range(args.times):
        t0 = time.perf_counter()
        c = StepCosts.for_device("cpu", measure_step_costs(eng.runner, eng.proposer, eng.blocks, token_id=0,
                                                           k=min(3, k_max), confidence=True))
        ks = [best_draft_len(p, k_max, 4, c, MARGIN) for p in (0.6, 0.7, 0.8)]
        print(f"{time.perf_counter() - t0:4.1f} s  T " + " ".join(f"{r:.0f}:{v:.2f}" for r, v in c.curve)
              + "  D " + " ".join(f"{r:.0f}:{v:.2f}" for r, v in c.draft_curve) + f"  K {ks}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
