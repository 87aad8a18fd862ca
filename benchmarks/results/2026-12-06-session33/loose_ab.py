# python loose_ab.py DTYPE CONCS [VARIANTS]: AR, adaptive DFlash as it is (DF), adaptive DFlash variants
# "PER:TRUST" (policy.MARGIN_PER_REQUEST = PER and policy.TRUST_BATCH = TRUST, set before each of that engine's
# steps), and fixed K = 1, side by side (side_by_side.py); every adaptive engine prices steps by DF's calibration
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-session32"))
torch.set_num_threads(2)
from side_by_side import line, run_level
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from dflash_trt.spec import policy as P
dt = sys.argv[1]; concs = [int(c) for c in sys.argv[2].split(",")]
variants = (sys.argv[3] if len(sys.argv) > 3 else "0.002:1000").split(",")
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
E = {"AR": LLM(speculative=False, **kw), "DF": LLM(draft=d, **kw)}
settings = {"DF": (P.MARGIN_PER_REQUEST, P.TRUST_BATCH)}
for v in variants:
    per, trust = v.split(":")
    llm = LLM(draft=d, **kw)
    pol = llm.engine.policy
    pol.costs = pol.lengths.costs = E["DF"].engine.policy.costs
    pol.lengths._break_even.clear()
    E[v] = llm
    settings[v] = (float(per), int(trust))
E["k1"] = LLM(draft=d, draft_len_policy="fixed", max_draft_len=1, **kw)
c = E["DF"].engine.policy.costs
print("costs relative to T(16):", [(int(x), round(y / c.target(16), 3)) for x, y in c.curve], flush=True)
def before(name):
    if name in settings:
        P.MARGIN_PER_REQUEST, P.TRUST_BATCH = settings[name]
for cc in concs:
    print(line(cc, run_level(E, cc, before_step=before)), flush=True)
