# python draft_parts.py WEIGHTS: the drafter's fused stack calls in a DFlash decode (in place, then replayed hot)
import sys, time, statistics, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.plugins import layer, invariant as bi
t, d = embedded_paths()
llm = LLM(target=t, dtype="bfloat16", weights=sys.argv[1], draft=d, draft_len_policy="fixed", max_draft_len=7)
layer.load()
orig = layer._state["stack"]; oh = torch.ops.dflash_trt.bi_head_argmax
cap = {"d": [], "t8": [], "head": []}
tot = {"d": 0.0, "t8": 0.0}
def wrap(*a):
    t0 = time.perf_counter(); r = orig(*a); dt = time.perf_counter() - t0
    if len(a[4]) == 3: cap["d"].append(a); tot["d"] += dt
    elif a[1].shape[0] == 8: cap["t8"].append(a); tot["t8"] += dt
    return r
layer._state["stack"] = wrap
p = ["Write a Python function that returns the n-th Fibonacci number."]
sp = SamplingParams(max_tokens=128, ignore_eos=True)
llm.generate(p, sp, chat=True)
cap = {"d": [], "t8": [], "head": []}; tot = {"d": 0.0, "t8": 0.0}
t0 = time.perf_counter()
out = llm.generate(p, sp, chat=True)
wall = time.perf_counter() - t0
layer._state["stack"] = orig
nd = len(cap["d"])
print(f"wall {wall*1e3:.0f} ms, drafter stack calls {nd}: {tot['d']/nd*1e3:.3f} ms each (in situ), 8-row target stack {len(cap['t8'])}: {tot['t8']/max(1,len(cap['t8']))*1e3:.3f} ms")
print("drafter stack arg shapes:", [tuple(x.shape) if hasattr(x, 'shape') else type(x).__name__ for x in cap["d"][-1][:4]])
ts = []
for i in range(200):
    a = cap["d"][i % nd]; t1 = time.perf_counter(); orig(*a); ts.append(time.perf_counter() - t1)
print(f"drafter stack replayed: median {statistics.median(ts)*1e3:.3f} ms")
