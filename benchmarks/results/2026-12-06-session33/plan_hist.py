# python plan_hist.py DTYPE C: the adaptive engine's drafts per iteration at concurrency C (how many requests
# drafted how many tokens), with its calibrated curve and the break-even acceptance of each K at this batch size
import os, sys, collections, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from dflash_trt.spec import policy as P
dt, C = sys.argv[1], int(sys.argv[2])
t, d = embedded_paths()
llm = LLM(target=t, draft=d, max_batch_size=32, dtype=dt)
e = llm.engine; pol = e.policy; costs = pol.costs
print("curve", [(x, round(y, 3)) for x, y in costs.curve], "draft", [(x, round(y, 3)) for x, y in costs.draft_curve])
for k in range(1, 5):
    lo, hi = 0.0, 1.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if P.pays(mid, k, C, costs, P.margin_for(C)) else (mid, hi)
    lo0, hi0 = 0.0, 1.0
    for _ in range(30):
        mid = (lo0 + hi0) / 2
        lo0, hi0 = (lo0, mid) if P.pays(mid, k, C, costs, 0.0) else (mid, hi0)
    print(f"K={k}: pays from p = {hi:.3f} with the margin {P.margin_for(C):.2f}, {hi0:.3f} without")
hist = collections.Counter()
op = e.proposer.propose
def prop(work, *a, **k):
    ks = tuple(sorted((w.draft_len for w in work if w.draft_len > 0), reverse=True))
    hist[(len(ks), ks[0] if ks else 0)] += 1
    return op(work, *a, **k)
e.proposer.propose = prop
n = [0]
st = e.step
def step():
    n[0] += 1; return st()
e.step = step
lp = ClosedLoop(llm, (PROMPTS * C)[:32], C, 64)
while lp.busy: lp.step()
print("iterations", n[0], "drafting (requests, K):", sorted(hist.items()), "tau", round(lp.figures()[2], 2))
