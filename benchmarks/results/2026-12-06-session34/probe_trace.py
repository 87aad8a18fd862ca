# python probe_trace.py DTYPE LEVELS: adaptive DFlash alone through the sweep's levels: each probe (iteration,
# batch, the request's idle steps before it, its tokens left, whether the engine's quiet rule made it) per level
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]; levels = [int(c) for c in sys.argv[2].split(",")]
t, d = embedded_paths()
llm = LLM(draft=d, target=t, max_batch_size=32, dtype=dt)
pol = llm.engine.policy; L = pol.lengths
log = []
f = pol.draft_len
def dl(seq, k_cap, batch, msl):
    idle, quiet = (seq.acceptance.idle if seq.acceptance else None), L.iteration - L.last_draft >= L.max_gap
    k = f(seq, k_cap, batch, msl)
    if seq.acceptance is not None and seq.acceptance.probing and k:
        log.append((L.iteration, batch, idle, seq.params.max_tokens - seq.num_output, quiet))
    return k
pol.draft_len = dl
for c in levels:
    log.clear()
    lp = ClosedLoop(llm, (PROMPTS * c)[:max(c, 32)], c, 64)
    while lp.busy: lp.step()
    print(f"c={c}: {len(log)} probes (iteration, batch, idle before, tokens left, quiet rule):", log[:30], flush=True)
