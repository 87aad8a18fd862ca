# python parts_ab.py: AR, a DFlash engine that never drafts (K=0) and adaptive DFlash side by side at 16 requests in bf16,
# six levels: per engine, the median per level of the ms each part of a step took (schedule, target pass, verify,
# commit, the proposer's observe and propose, postprocess, the whole step)
import os, sys, time, torch, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
t, d = embedded_paths()
E = {"AR": LLM(target=t, max_batch_size=32, dtype="bfloat16", speculative=False),
     "K0": LLM(draft=d, target=t, max_batch_size=32, dtype="bfloat16", draft_len_schedule={1: 0}),
     "DF": LLM(draft=d, target=t, max_batch_size=32, dtype="bfloat16")}
def wrap(e, obj, nm, tag):
    f = getattr(obj, nm)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); e._t[tag] = e._t.get(tag, 0.0) + time.perf_counter() - t0; return r
    setattr(obj, nm, g)
for n, llm in E.items():
    e = llm.engine; e._t = {}
    wrap(e, e.scheduler, "schedule", "sched"); wrap(e, e.runner, "run", "run"); wrap(e, e.runner, "commit", "commit")
    wrap(e, e.proposer, "observe", "pobs"); wrap(e, e.proposer, "propose", "prop"); wrap(e, e.scheduler, "postprocess", "post")
    wrap(e, e, "verifier", "verify"); wrap(e, e, "step", "step")
acc = {n: {} for n in E}
for c in (16,) * 6:
    ps = (PROMPTS * c)[:32]
    loops = {n: ClosedLoop(llm, ps, c, 64) for n, llm in E.items()}
    for llm in E.values(): llm.engine._t = {}
    while any(lp.busy for lp in loops.values()):
        for n, lp in loops.items():
            if lp.busy: lp.step()
    for n, llm in E.items():
        for k, v in llm.engine._t.items(): acc[n].setdefault(k, []).append(v)
for n in E:
    print(n, {k: round(statistics.median(v) * 1e3, 1) for k, v in acc[n].items()})
