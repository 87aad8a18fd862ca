# python level_drafts.py DTYPE LEVELS: adaptive DFlash alone through the sweep's levels: per level, the iterations
# that drafted (iteration, decoding batch, drafts per request, planned K, probe or not)
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]; levels = [int(c) for c in sys.argv[2].split(",")]
t, d = embedded_paths()
llm = LLM(draft=d, target=t, max_batch_size=32, dtype=dt)
e = llm.engine; pol = e.policy
log = []
op = e.proposer.propose
def prop(work, *a, **k):
    dec = [s for s in e.scheduler.running if not s.in_prefill]
    log.append((pol.lengths.iteration, len(dec), [w.draft_len for w in work if w.draft_len], pol.planned,
                sum(1 for w in work if w.seq.acceptance and w.seq.acceptance.probing)))
    return op(work, *a, **k)
e.proposer.propose = prop
for c in levels:
    log.clear()
    lp = ClosedLoop(llm, (PROMPTS * c)[:max(c, 32)], c, 64)
    while lp.busy: lp.step()
    print(f"c={c}: tok/s {lp.figures()[0]:.1f} tau {lp.figures()[2]:.2f}, {len(log)} drafting iterations "
          "(iteration, batch, drafts, planned, probes):", log[:40] if c >= 16 else "", flush=True)
