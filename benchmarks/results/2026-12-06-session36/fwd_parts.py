# python fwd_parts.py [w8a8]: the target forward against the fused stack inside it, AR (1 row) and a fixed K = 7 verify
# (8 rows), prompts alternating between the two engines as in spec_limit.py; medians
# target forward vs the fused stack inside it, AR (1 row) against a K = 7 verify (8 rows), W8A8, interleaved prompts
import sys, time, statistics, torch
import os; sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
import spec_limit as sl
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.plugins import layer
w = sys.argv[1] if len(sys.argv) > 1 else "w8a8"
t, d = embedded_paths()
ar = LLM(target=t, speculative=False, dtype="bfloat16", weights=w)
sd = LLM(target=t, draft=d, draft_len_policy="fixed", dtype="bfloat16", weights=w)
layer.load()
orig = layer._state["stack"]
st = {1: [], 8: []}
def wrap(*a):
    t0 = time.perf_counter(); r = orig(*a)
    if len(a[4]) == 30 and a[1].shape[0] in st: st[a[1].shape[0]].append(time.perf_counter() - t0)
    return r
layer._state["stack"] = wrap
fa, fv = sl.Timed(ar.engine.target, "forward"), sl.Timed(sd.engine.target, "forward")
sp = SamplingParams(max_tokens=128, ignore_eos=True)
sl.decode(ar, SamplingParams(max_tokens=8, ignore_eos=True), []); sl.decode(sd, SamplingParams(max_tokens=8, ignore_eos=True), [])
for k in st: st[k].clear()
fa.times.clear(); fv.times.clear()
for _ in range(4):
    for p in sl.PROMPTS:
        sl.decode(ar, sp, [fa], [p]); sl.decode(sd, sp, [fv], [p])
m = lambda v: statistics.median(v) * 1e3
print(f"{w}: forward AR {m(fa.times):.2f} ms (stack {m(st[1]):.2f}), verify {m(fv.times):.2f} ms (stack {m(st[8]):.2f}); "
      f"outside the stack {m(fa.times) - m(st[1]):.2f} / {m(fv.times) - m(st[8]):.2f}")
