# python observe_calls.py: the proposer's observe per step of a DFlash engine that never drafts (K=0), 16 requests in bf16, four
# levels: median microseconds per call and ms per level (run once with the old code on PYTHONPATH, once with the new)
import os, sys, time, torch, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
t, d = embedded_paths()
llm = LLM(draft=d, target=t, max_batch_size=32, dtype="bfloat16", draft_len_schedule={1: 0})
e = llm.engine; p = e.proposer
ts = []
fo = p.observe
def obs(*a, **k):
    t0 = time.perf_counter(); r = fo(*a, **k); ts.append(time.perf_counter() - t0); return r
p.observe = obs
for _ in range(4):
    ts.clear()
    lp = ClosedLoop(llm, (PROMPTS * 16)[:32], 16, 64)
    while lp.busy: lp.step()
    ts.sort(); print("observe calls", len(ts), "median us", round(ts[len(ts)//2]*1e6, 1), "sum ms", round(sum(ts)*1e3, 2))
