# python propose_cprofile.py DTYPE C: cProfile of the drafter's propose and observe only, fixed K = 1 at C requests
# (32 requests, 64 tokens), by own time
import os, sys, cProfile, pstats, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, C = sys.argv[1], int(sys.argv[2])
t, d = embedded_paths()
llm = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=1, max_batch_size=32, dtype=dt)
p = llm.engine.proposer
pr, on = cProfile.Profile(), [False]
def profiled(f):
    def g(*a, **k):
        if on[0]: pr.enable()
        try: return f(*a, **k)
        finally:
            if on[0]: pr.disable()
    return g
p.propose, p.observe = profiled(p.propose), profiled(p.observe)
lp = ClosedLoop(llm, (PROMPTS * C)[:32], C, 64)
for _ in range(8): lp.step()
on[0] = True
for i in range(20): lp.step()
pstats.Stats(pr).sort_stats("tottime").print_stats(22)
