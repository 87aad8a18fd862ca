# python step_parts.py MODE C: closed loop at concurrency C (32 requests, 64 tokens), bf16 embedded pair.
# MODE ar | k1 (fixed K=1) | adaptive. Per-step time by part (ms, mean over steps with C decoding rows).
import os
import sys, time, collections, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
mode, C = sys.argv[1], int(sys.argv[2])
t, d = embedded_paths()
kw = dict(max_batch_size=32, dtype="bfloat16")
if mode == "ar": llm = LLM(target=t, speculative=False, **kw)
elif mode == "k1": llm = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=1, **kw)
else: llm = LLM(target=t, draft=d, **kw)
e = llm.engine
acc = collections.defaultdict(float); cur = {}
def wrap(obj, name, tag):
    f = getattr(obj, name)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); cur[tag] = cur.get(tag, 0) + time.perf_counter() - t0; return r
    setattr(obj, name, g)
wrap(e.scheduler, "schedule", "sched"); wrap(e.runner, "run", "run"); wrap(e.target, "forward", "fwd")
wrap(e.target, "greedy_tokens", "head"); wrap(e.target, "logits", "logits")
if e.proposer is not None and hasattr(e.proposer, "propose"):
    wrap(e.proposer, "propose", "draft"); wrap(e.proposer, "observe", "observe")
wrap(e.runner, "commit", "commit"); wrap(e.scheduler, "postprocess", "post")
step = e.step
n = [0]
def st():
    cur.clear(); t0 = time.perf_counter(); r = step(); tot = time.perf_counter() - t0
    rows = sum(1 for s in e.scheduler.running) if hasattr(e.scheduler, "running") else 0
    if cur.get("fwd"):
        for k, v in cur.items(): acc[k] += v
        acc["total"] += tot; n[0] += 1
    return r
e.step = st
lp = ClosedLoop(llm, (PROMPTS * C)[:32], C, 64)
while lp.busy: lp.step()
print(mode, C, "tok/s, user, tau", lp.figures())
print(" ".join(f"{k} {v / n[0] * 1e3:.2f}" for k, v in sorted(acc.items())), "steps", n[0])
