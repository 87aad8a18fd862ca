# python c16_diag.py DTYPE CONCS: AR, AR2, DFlash adaptive, DFlash that never drafts (K=0) side by side; DFlash's
# drafting iterations (how many, at which batch sizes, probes)
import os
import sys, collections, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(2)
from side_by_side import line, run_level
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]; concs = [int(c) for c in sys.argv[2].split(",")]
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
E = {"AR": LLM(speculative=False, **kw), "AR2": LLM(speculative=False, **kw), "DF": LLM(draft=d, **kw),
     "K0": LLM(draft=d, draft_len_schedule={1: 0}, **kw)}
eng = E["DF"].engine
log = collections.Counter()
orig = eng.proposer.propose
def prop(drafting, *a, **k):
    log[(len(eng.scheduler.running) if hasattr(eng.scheduler, "running") else -1, len(drafting),
         sum(w.draft_len for w in drafting))] += 1
    return orig(drafting, *a, **k)
eng.proposer.propose = prop
for cc in concs:
    log.clear()
    print(line(cc, run_level(E, cc)), flush=True)
    print("  drafting iterations (running, drafting requests, drafts): count", sorted(log.items()), flush=True)
