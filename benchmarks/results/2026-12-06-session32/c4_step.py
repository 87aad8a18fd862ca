# (run at 6620ee5, whose calibration has the 17-row point; the point was reverted after these runs: c4_step.txt)
# python c4_step.py CONCS: AR, AR2, DFlash as calibrated (the 17-row point), DFlash with that point dropped (a line
# from 16 rows to 32), side by side; each DFlash engine's drafting iterations by total drafts
import os, sys, collections, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(2)
from side_by_side import line, run_level
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
concs = [int(c) for c in sys.argv[1].split(",")]
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype="bfloat16")
E = {"AR": LLM(speculative=False, **kw), "AR2": LLM(speculative=False, **kw), "stair": LLM(draft=d, **kw),
     "line": LLM(draft=d, **kw)}
c = E["line"].engine.policy.costs
c.curve = tuple(pt for pt in c.curve if pt[0] != 17)
print("stair", E["stair"].engine.policy.costs.curve, "\nline", c.curve, flush=True)
logs = {}
for n in ("stair", "line"):
    eng, log = E[n].engine, collections.Counter()
    orig = eng.proposer.propose
    def prop(drafting, *a, _o=orig, _l=log, **k):
        _l[sum(w.draft_len for w in drafting)] += 1
        return _o(drafting, *a, **k)
    eng.proposer.propose = prop
    logs[n] = log
for cc in concs:
    for l in logs.values(): l.clear()
    print(line(cc, run_level(E, cc)), flush=True)
    for n, l in logs.items():
        print(f"  {n} drafting iterations by drafts: {sorted(l.items())}", flush=True)
