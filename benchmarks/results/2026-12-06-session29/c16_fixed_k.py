# python c16_fixed_k.py [bfloat16|float32] [CONCURRENCY] [REQUESTS]: batching.py's closed loop at one concurrency for AR and
# DFlash drafting a fixed K = 1, 2, 3 every step (stepping in turn), with the adaptive engine's start-up cost curve
# and what it predicts for each K: does drafting pay at this batch size, and does the curve say so
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from batching import ClosedLoop, PROMPTS
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dtype = sys.argv[1] if len(sys.argv) > 1 else "bfloat16"
C = int(sys.argv[2]) if len(sys.argv) > 2 else 16
R = int(sys.argv[3]) if len(sys.argv) > 3 else 32
t, d = embedded_paths()
common = dict(target=t, max_batch_size=C, dtype=dtype)
engines = {"AR": LLM(speculative=False, **common)}
for k in (1, 2, 3):
    engines[f"K={k}"] = LLM(draft=d, speculative=True, draft_len_policy="fixed", max_draft_len=k, **common)
adaptive = LLM(draft=d, speculative=True, **common)
c = adaptive.engine.policy.costs
print("adaptive engine's curve: target by rows", [(n, round(v, 2)) for n, v in c.curve],
      "drafter by requests", [(n, round(v, 2)) for n, v in c.draft_curve])
for k in (1, 2, 3):
    step = c.target(C * (k + 1)) + c.drafter(C, k)
    print(f"  curve: K={k} step {step:.2f} vs AR {c.target(C):.2f} units: tokens needed per request "
          f"{step / c.target(C):.2f}")
loops = {n: ClosedLoop(llm, (PROMPTS * (R // len(PROMPTS) + C))[:max(C, R)], C, 64) for n, llm in engines.items()}
while any(lp.busy for lp in loops.values()):
    for lp in loops.values():
        if lp.busy:
            lp.step()
ar = loops["AR"].figures()[0]
for n, lp in loops.items():
    tok, _, tau = lp.figures()
    steps = len(lp.eng.metrics.iterations) if hasattr(lp.eng.metrics, "iterations") else 0
    print(f"{n:4s} {tok:7.1f} tok/s  {tok / ar:.2f}x AR  tau {tau:.2f}  clock {lp.clock:.2f} s  steps {steps}"
          f"  s/step {lp.clock / max(steps, 1) * 1e3:.1f} ms", flush=True)
