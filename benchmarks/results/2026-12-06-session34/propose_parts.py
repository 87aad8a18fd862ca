# python propose_parts.py DTYPE C [K]: wall time of the drafter's propose and observe by part (perf_counter, no
# profiler), fixed K at C requests (64-token requests), beside the whole engine step
import os, sys, time, collections, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, C = sys.argv[1], int(sys.argv[2]); K = int(sys.argv[3]) if len(sys.argv) > 3 else 1
t, d = embedded_paths()
llm = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=K, max_batch_size=32, dtype=dt)
e = llm.engine; p = e.proposer; dr = p.drafter
tot = collections.Counter(); on = [False]
def timed(obj, name, label):
    f = getattr(obj, name)
    def g(*a, **k):
        t0 = time.perf_counter()
        try: return f(*a, **k)
        finally:
            if on[0]: tot[label] += time.perf_counter() - t0
    setattr(obj, name, g)
timed(p, "propose", "propose"); timed(p, "observe", "observe"); timed(p, "write_context", "write_context")
timed(p, "_blocks", "_blocks"); timed(p.target, "embed", "embed"); timed(dr, "forward", "drafter fwd")
timed(dr, "draft_tokens", "draft_tokens"); timed(e, "step", "engine step")
lp = ClosedLoop(llm, (PROMPTS * C)[:max(C, 32)], C, 64)
for _ in range(8): lp.step()
on[0] = True; n = 30
for i in range(n): lp.step()
for k, v in tot.most_common(): print(f"{v / n * 1e3:8.3f} ms/step  {k}")
