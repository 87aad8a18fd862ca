# python fixed_k.py DTYPE CONCS [KS]: AR, adaptive DFlash and DFlash at fixed K side by side (side_by_side.py)
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-session32"))
torch.set_num_threads(2)
from side_by_side import line, run_level
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]; concs = [int(c) for c in sys.argv[2].split(",")]
ks = [int(k) for k in (sys.argv[3] if len(sys.argv) > 3 else "1,2,3").split(",")]
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
E = {"AR": LLM(speculative=False, **kw), "DF": LLM(draft=d, **kw)}
for k in ks:
    E[f"k{k}"] = LLM(draft=d, draft_len_policy="fixed", max_draft_len=k, **kw)
print("adaptive costs:", E["DF"].engine.policy.costs.curve, E["DF"].engine.policy.costs.draft_curve, flush=True)
for cc in concs:
    print(line(cc, run_level(E, cc)), flush=True)
