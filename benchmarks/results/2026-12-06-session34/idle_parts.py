# python idle_parts.py DTYPE C [ROUNDS] [k0]: AR, a second AR (k0: a DFlash engine that never drafts) and adaptive
# DFlash engines side by side at concurrency C
# (32 requests, 64 tokens), where DFlash drafts nothing: ms per full step of the whole step, the target pass
# (runner.run) the engine's other parts and the rest, per round, and the whole run's tok/s ratio
import os, sys, time, collections, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, C = sys.argv[1], int(sys.argv[2]); R = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3].isdigit() else 3
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
second = ("K=0", dict(draft=d, draft_len_schedule={1: 0})) if sys.argv[-1] == "k0" else ("AR2", dict(speculative=False))
E = {"AR": LLM(speculative=False, **kw), second[0]: LLM(**second[1], **kw), "DF": LLM(draft=d, **kw)}
cur = {}
def wrap(obj, name, tag):
    f = getattr(obj, name)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); cur[tag] = cur.get(tag, 0) + time.perf_counter() - t0; return r
    setattr(obj, name, g)
PARTS = ["run", "schedule", "observe", "postprocess", "commit", "verifier", "cut", "build"]
for n, llm in E.items():
    e = llm.engine
    wrap(e.runner, "run", "run"); wrap(e.scheduler, "schedule", "schedule"); wrap(e.scheduler, "postprocess", "postprocess")
    wrap(e.runner, "commit", "commit"); wrap(e.policy, "cut", "cut")
    if e.proposer is not None: wrap(e.proposer, "observe", "observe")
    v = e.verifier; e.verifier = lambda *a, _v=v: (lambda t0: (_v(*a), cur.__setitem__("verifier", time.perf_counter() - t0))[0])(time.perf_counter())
for r in range(R):
    acc = {n: collections.defaultdict(float) for n in E}
    ps = (PROMPTS * C)[:max(C, 32)]
    L = {n: ClosedLoop(llm, ps, C, 64) for n, llm in E.items()}
    while any(lp.busy for lp in L.values()):
        for n, lp in L.items():
            if not lp.busy: continue
            full = len(lp.live) == C and all(s.num_output > 0 for s in lp.live)
            cur.clear(); t0 = time.perf_counter(); lp.step(); tot = time.perf_counter() - t0
            b = acc[n]; b["all"] += tot; b["nall"] += 1
            if not full:
                b["other"] += tot; b["nother"] += 1; b["orun"] += cur.get("run", 0)
            if full:
                a = acc[n]; a["steps"] += 1; a["total"] += tot; [a.__setitem__(k, a[k] + cur.get(k, 0)) for k in PARTS]
    out = []
    for n, a in acc.items():
        s = a["steps"]
        parts = " ".join(f"{k} {a[k] / s * 1e3:.3f}" for k in PARTS)
        out.append(f"{n} {a['total'] / s * 1e3:.2f} ({parts} rest "
                   f"{(a['total'] - sum(a[k] for k in PARTS)) / s * 1e3:.3f}) {L[n].figures()[0] / L['AR'].figures()[0]:.3f}x; "
                   f"other steps {a['nother']:.0f}: {a['other'] * 1e3:.1f} ms (run {a['orun'] * 1e3:.1f}), all {a['all'] * 1e3:.0f} ms")
    print(f"round {r}: ms/full step:\n  " + "\n  ".join(out), flush=True)
