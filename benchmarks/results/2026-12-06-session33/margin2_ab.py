# python margin2_ab.py DTYPE CONCS [BASE:PER,...] [REPS]: AR, AR2, and adaptive DFlash engines whose margin is
# BASE at one request and grows by PER for every request beside the first (policy.MARGIN and
# policy.MARGIN_PER_REQUEST, set before each of that engine's steps), side by side (side_by_side.py); every
# adaptive engine prices steps by the first one's calibration
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-session32"))
torch.set_num_threads(2)
from side_by_side import line, run_level
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from dflash_trt.spec import policy as P
dt = sys.argv[1]; concs = [int(c) for c in sys.argv[2].split(",")]
given = sys.argv[3] if len(sys.argv) > 3 else "0.05:0.01,0.03:0.005"
pers = [tuple(float(v) for v in x.split(":")) for x in given.split(",")]
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 1
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
E = {"AR": LLM(speculative=False, **kw), "AR2": LLM(speculative=False, **kw)}
per_engine = {}
first = None
for x in pers:
    llm = LLM(draft=d, **kw)
    pol = llm.engine.policy
    if first is None:
        first = pol.costs
    pol.costs = pol.lengths.costs = first
    pol.lengths._break_even.clear()
    E[f"m{x[0]:g}:{x[1]:g}"] = llm
    per_engine[f"m{x[0]:g}:{x[1]:g}"] = x
c = first
print("costs relative to T(16):", [(int(x), round(y / c.target(16), 3)) for x, y in c.curve], flush=True)
def before(name):
    if name in per_engine:
        P.MARGIN, P.MARGIN_PER_REQUEST = per_engine[name]
for r in range(reps):
    for cc in concs:
        print(line(cc, run_level(E, cc, before_step=before)), flush=True)
