# python high_concurrency_split.py
# c=32, fp32: AR vs DFlash (adaptive): per-step wall split into the target forward, the drafter's context writes,
# the proposer (drafting) and the rest; both engines alternate rounds.
import sys, time, torch
sys.path.insert(0, "/work/main/benchmarks")
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
t, d = embedded_paths()
common = dict(target=t, max_batch_size=32, dtype="float32")
class Timed:
    def __init__(self, obj, name):
        self.obj, self.name, self.orig, self.t = obj, name, getattr(obj, name), 0.0
        setattr(obj, name, self)
    def __call__(self, *a, **k):
        t0 = time.perf_counter(); r = self.orig(*a, **k); self.t += time.perf_counter() - t0; return r
ar = LLM(speculative=False, **common)
sd = LLM(draft=d, speculative=True, draft_len_policy="adaptive", **common)
tf_ar = Timed(ar.engine.target, "forward")
tf_sd = Timed(sd.engine.target, "forward")
prop = sd.engine.proposer
wc = Timed(prop.drafter, "write_context")
pp = Timed(prop, "propose")
for rnd in range(2):
    for name, llm in (("AR", ar), ("DFlash", sd)):
        for tm in (tf_ar, tf_sd, wc, pp): tm.t = 0.0
        loop = ClosedLoop(llm, PROMPTS[:32], 32, 64)
        while loop.busy: loop.step()
        toks = sum(len(s.output_ids) if hasattr(s, "output_ids") else 64 for s in loop.done)
        tf = tf_ar.t if name == "AR" else tf_sd.t
        extra = f" context writes {wc.t:.3f} s, propose {pp.t:.3f} s" if name == "DFlash" else ""
        print(f"{name}: {loop.clock:.3f} s engine clock, target forward {tf:.3f} s, rest {loop.clock - tf - (wc.t + pp.t if name == 'DFlash' else 0):.3f} s;{extra}", flush=True)
