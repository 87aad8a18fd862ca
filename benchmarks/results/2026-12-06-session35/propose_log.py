# python propose_log.py: adaptive DFlash beside AR at 16 requests in bf16, five levels from a fresh engine: each drafter
# pass (iteration, requests, ms, (context rows written, ms))
import os, sys, time, torch, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
t, d = embedded_paths()
E = {"AR": LLM(target=t, max_batch_size=32, dtype="bfloat16", speculative=False),
     "DF": LLM(draft=d, target=t, max_batch_size=32, dtype="bfloat16")}
e = E["DF"].engine; p = e.proposer
log = []
fp = p.propose; fw = p.drafter.write_context
cur = {}
def wc(f, *a, **k):
    t0 = time.perf_counter(); r = fw(f, *a, **k); cur["w"] = (f.shape[0], round((time.perf_counter() - t0) * 1e3, 2)); return r
p.drafter.write_context = wc
def prop(work, *a, **k):
    cur.clear(); t0 = time.perf_counter(); r = fp(work, *a, **k)
    log.append((e.policy.lengths.iteration, len(work), round((time.perf_counter() - t0) * 1e3, 2), cur.get("w"))); return r
p.propose = prop
for c in (16,) * 5:
    ps = (PROMPTS * c)[:32]
    loops = {n: ClosedLoop(llm, ps, c, 64) for n, llm in E.items()}
    log.clear()
    while any(lp.busy for lp in loops.values()):
        for n, lp in loops.items():
            if lp.busy: lp.step()
    print(log)
