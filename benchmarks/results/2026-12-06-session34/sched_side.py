# python sched_side.py DTYPE C: the scheduler's schedule() per step, median ms, for AR, a DFlash engine that never
# drafts (K=0) and adaptive DFlash side by side at C requests (32 requests, 64 tokens), and their whole steps
import os, sys, time, statistics, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, C = sys.argv[1], int(sys.argv[2])
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
E = {"AR": LLM(speculative=False, **kw), "K=0": LLM(draft=d, draft_len_schedule={1: 0}, **kw), "DF": LLM(draft=d, **kw)}
T, S = {n: [] for n in E}, {n: [] for n in E}
for n, llm in E.items():
    sc = llm.engine.scheduler; f = sc.schedule
    def g(f=f, n=n):
        t0 = time.perf_counter(); r = f(); T[n].append(time.perf_counter() - t0); return r
    sc.schedule = g
L = {n: ClosedLoop(llm, (PROMPTS * C)[:max(C, 32)], C, 64) for n, llm in E.items()}
while any(lp.busy for lp in L.values()):
    for n, lp in L.items():
        if lp.busy:
            t0 = time.perf_counter(); lp.step(); S[n].append(time.perf_counter() - t0)
for n in E:
    print(f"{n}: schedule median {statistics.median(T[n]) * 1e3:.3f} ms (mean {statistics.mean(T[n]) * 1e3:.3f}), "
          f"step median {statistics.median(S[n]) * 1e3:.2f} ms, tok/s {L[n].figures()[0]:.1f}; slowest schedules (step, ms) "
          f"{sorted(((round(x * 1e3, 2), i) for i, x in enumerate(T[n])), reverse=True)[:6]}")
