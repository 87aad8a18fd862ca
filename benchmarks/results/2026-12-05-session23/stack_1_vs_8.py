import sys, time, statistics, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.plugins import layer
dt = sys.argv[1]; reps = int(sys.argv[2]); wts = sys.argv[3] if len(sys.argv) > 3 else "auto"
t, d = embedded_paths()
llm = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=7, dtype=dt, weights=wts)
ar = LLM(target=t, dtype=dt, weights=wts, speculative=False)
layer.load()
orig = layer._state["stack"]
cap = {}
def wrap(*a):
    if len(a[4]) == 30 and a[1].shape[0] in (1, 8): cap[a[1].shape[0]] = a
    return orig(*a)
layer._state["stack"] = wrap
ar.generate(["Write a Python function that returns the n-th Fibonacci number."], SamplingParams(max_tokens=250, ignore_eos=True), chat=True)
llm.generate(["Write a Python function that returns the n-th Fibonacci number."], SamplingParams(max_tokens=250, ignore_eos=True), chat=True)
layer._state["stack"] = orig
print(sorted(cap))
for _ in range(10): orig(*cap[8])
ts = {1: [], 8: []}
for _ in range(reps):
    for n in (1, 8):
        t0 = time.perf_counter(); orig(*cap[n]); ts[n].append(time.perf_counter() - t0)
m1, m8 = statistics.median(ts[1]), statistics.median(ts[8])
print(f"1 row {m1*1e3:.3f} ms  8 rows {m8*1e3:.3f} ms  ratio {m8/m1:.3f}")
if len(sys.argv) > 4:
    print("go", flush=True)
    n = int(sys.argv[4])
    while True: orig(*cap[n])
