# python parts_side.py DTYPE C [KS]: AR, adaptive and fixed-K DFlash engines side by side at concurrency C
# (32 requests, 64 tokens): per engine, ms per step of the whole step, the target pass (runner.run), the drafter
# (propose) and the rest, over the steps where all C requests decode; and what the adaptive engine's cost model
# (its calibration) prices the fixed-K steps at
import os, sys, time, collections, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, C = sys.argv[1], int(sys.argv[2])
ks = [int(k) for k in (sys.argv[3] if len(sys.argv) > 3 else "1,2").split(",")]
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
E = {"AR": LLM(speculative=False, **kw), "DF": LLM(draft=d, **kw)}
for k in ks:
    E[f"k{k}"] = LLM(draft=d, draft_len_policy="fixed", max_draft_len=k, **kw)
acc = {n: collections.defaultdict(float) for n in E}
cur = {}
def wrap(obj, name, tag):
    f = getattr(obj, name)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); cur[tag] = cur.get(tag, 0) + time.perf_counter() - t0; return r
    setattr(obj, name, g)
for n, llm in E.items():
    e = llm.engine
    wrap(e.runner, "run", "run")
    if e.proposer is not None: wrap(e.proposer, "propose", "draft")
ps = (PROMPTS * C)[:max(C, 32)]
L = {n: ClosedLoop(llm, ps, C, 64) for n, llm in E.items()}
while any(lp.busy for lp in L.values()):
    for n, lp in L.items():
        if not lp.busy: continue
        e = lp.eng
        full = len(lp.live) == C and all(s.num_output > 0 for s in lp.live)
        cur.clear(); t0 = time.perf_counter(); lp.step(); tot = time.perf_counter() - t0
        if full:
            a = acc[n]; a["steps"] += 1; a["total"] += tot
            for k, v in cur.items(): a[k] += v
for n, a in acc.items():
    s = a["steps"]
    print(f"{n}: {s:.0f} full steps, ms/step total {a['total'] / s * 1e3:.2f} run {a['run'] / s * 1e3:.2f} "
          f"draft {a.get('draft', 0) / s * 1e3:.2f} rest {(a['total'] - a['run'] - a.get('draft', 0)) / s * 1e3:.2f}",
          "| tok/s", f"{L[n].figures()[0]:.1f}", "tau", f"{L[n].figures()[2]:.2f}")
pol = E["DF"].engine.policy.costs
ar = acc["AR"]["total"] / acc["AR"]["steps"]
for k in ks:
    a = acc[f"k{k}"]
    print(f"K={k}: measured step / AR step {a['total'] / a['steps'] / ar:.3f}, target pass / AR pass "
          f"{a['run'] / a['steps'] / (acc['AR']['run'] / acc['AR']['steps']):.3f}; model "
          f"{(pol.target(C * (k + 1)) + pol.drafter(C, k)) / pol.target(C):.3f} "
          f"(target {pol.target(C * (k + 1)) / pol.target(C):.3f}, drafter "
          f"{pol.drafter(C, k) / pol.target(C) * acc['AR']['run'] / acc['AR']['steps'] * 1e3:.2f} ms"
          " at the AR pass's ms)")
print("costs", pol.curve, pol.draft_curve, pol.draft_rows)
