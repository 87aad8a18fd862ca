# Interleaved closed loops at one concurrency: AR and DFlash engine variants, one engine step each in turn
# (batching.py's ClosedLoop), each timed by its own clock.
#   python pol_ab.py DTYPE CONCURRENCY REQUESTS ROUNDS NAME:key=value,... ...
# keys: any LLM keyword (trim_draft_block=0/1, draft_len_policy=fixed, max_draft_len=2, min_draft_confidence=0.4),
# old=1 (per-request pricing: SpecPolicy.plan disabled), oldcurve=1 (the cost curve without its 8- and 12-row
# points, as calibrated before)
import sys, torch
torch.set_num_threads(2)
sys.path.insert(0, "/work/main/benchmarks")
from batching import PROMPTS, ClosedLoop
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
t, d = embedded_paths()
dt = sys.argv[1]; cc = int(sys.argv[2]); nreq = int(sys.argv[3]); rounds = int(sys.argv[4])
variants = {"AR": dict(speculative=False)}
for spec in sys.argv[5:]:
    name, _, kv = spec.partition(":")
    kw = dict(draft=d)
    for a in filter(None, kv.split(",")):
        k, v = a.split("=")
        kw[k] = v if k == "draft_len_policy" else (v == "1" if k == "trim_draft_block" else float(v) if "." in v else int(v))
    variants[name] = kw
old = {n for n, kw in variants.items() if kw.pop("old", 0)}
oldcurve = {n for n, kw in variants.items() if kw.pop("oldcurve", 0)}
eng = {n: LLM(target=t, max_batch_size=32, dtype=dt, **kw) for n, kw in variants.items()}
for n in old: eng[n].engine.policy.plan = lambda *a: None
for n in oldcurve:
    pc = eng[n].engine.policy.costs
    pc.curve = tuple(p for p in pc.curve if p[0] not in (8.0, 12.0)); eng[n].engine.policy.lengths._break_even.clear()
    print(n, pc.curve)
for rnd in range(rounds):
    loops = {n: ClosedLoop(llm, (PROMPTS * 8)[:nreq], cc, 64) for n, llm in eng.items()}
    while any(l.busy for l in loops.values()):
        for l in loops.values():
            if l.busy: l.step()
    fig = {n: l.figures() for n, l in loops.items()}
    print(f"c={cc}", " ".join(f"{n} {fig[n][0]:.1f} ({fig[n][0] / fig['AR'][0]:.3f}x, tau {fig[n][2]:.2f})" for n in eng), flush=True)
