# python draft_cprofile.py DTYPE C: cProfile of the drafter's propose in fixed-K=1 steps at C requests
import os, sys, cProfile, pstats, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, C = sys.argv[1], int(sys.argv[2])
t, d = embedded_paths()
llm = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=1, max_batch_size=32, dtype=dt)
e = llm.engine
pr = cProfile.Profile()
op = e.proposer.propose
on = [False]
def prop(*a, **k):
    if on[0]: pr.enable()
    try: return op(*a, **k)
    finally:
        if on[0]: pr.disable()
e.proposer.propose = prop
lp = ClosedLoop(llm, (PROMPTS * C)[:32], C, 64)
for _ in range(8): lp.step()
on[0] = True
for i in range(20): lp.step()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
