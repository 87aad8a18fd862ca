# python sched_cprofile.py DTYPE C: cProfile of the scheduler's schedule only, adaptive DFlash at C requests
import os, sys, cProfile, pstats, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, C = sys.argv[1], int(sys.argv[2])
t, d = embedded_paths()
llm = LLM(draft=d, target=t, max_batch_size=32, dtype=dt)
sc = llm.engine.scheduler; f = sc.schedule; pr = cProfile.Profile(); on = [False]
def g():
    if on[0]: pr.enable()
    try: return f()
    finally: pr.disable()
sc.schedule = g
lp = ClosedLoop(llm, (PROMPTS * C)[:max(C, 32)], C, 64)
for _ in range(4): lp.step()
on[0] = True
for _ in range(40): lp.step()
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(16); st.print_callers("batch_draft_len")
