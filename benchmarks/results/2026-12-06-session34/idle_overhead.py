# python idle_overhead.py DTYPE C [ROUNDS]: AR, a second AR and adaptive DFlash engines side by side at concurrency C
# (32 requests, 64 tokens), where DFlash drafts nothing: ms per full step of the whole step, the target pass
# (runner.run) and the rest, per round, and the whole run's tok/s ratio
import os, sys, time, collections, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, C = sys.argv[1], int(sys.argv[2]); R = int(sys.argv[3]) if len(sys.argv) > 3 else 3
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
E = {"AR": LLM(speculative=False, **kw), "AR2": LLM(speculative=False, **kw), "DF": LLM(draft=d, **kw)}
cur = {}
def wrap(obj, name, tag):
    f = getattr(obj, name)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); cur[tag] = cur.get(tag, 0) + time.perf_counter() - t0; return r
    setattr(obj, name, g)
for n, llm in E.items():
    wrap(llm.engine.runner, "run", "run")
for r in range(R):
    acc = {n: collections.defaultdict(float) for n in E}
    ps = (PROMPTS * C)[:max(C, 32)]
    L = {n: ClosedLoop(llm, ps, C, 64) for n, llm in E.items()}
    while any(lp.busy for lp in L.values()):
        for n, lp in L.items():
            if not lp.busy: continue
            full = len(lp.live) == C and all(s.num_output > 0 for s in lp.live)
            cur.clear(); t0 = time.perf_counter(); lp.step(); tot = time.perf_counter() - t0
            if full:
                a = acc[n]; a["steps"] += 1; a["total"] += tot; a["run"] += cur.get("run", 0)
    out = []
    for n, a in acc.items():
        s = a["steps"]
        out.append(f"{n} {a['total'] / s * 1e3:.2f} (run {a['run'] / s * 1e3:.2f} rest "
                   f"{(a['total'] - a['run']) / s * 1e3:.2f}) {L[n].figures()[0] / L['AR'].figures()[0]:.3f}x")
    print(f"round {r}: ms/full step: " + " | ".join(out), flush=True)
