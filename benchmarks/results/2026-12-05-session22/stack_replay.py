import sys, time, statistics, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.plugins import layer
dt = sys.argv[1]; n_rows = int(sys.argv[2]); reps = int(sys.argv[3]); wts = sys.argv[4] if len(sys.argv) > 4 else "auto"
t, d = embedded_paths()
kw = dict(draft=d, draft_len_policy="fixed", max_draft_len=7) if n_rows > 1 else dict(speculative=False)
llm = LLM(target=t, dtype=dt, weights=wts, **kw)
layer.load()
orig = layer._state["stack"]
cap = {}
def wrap(*a):
    if len(a[4]) == 30 and a[1].shape[0] == n_rows: cap[n_rows] = a
    return orig(*a)
layer._state["stack"] = wrap
llm.generate(["Write a Python function that returns the n-th Fibonacci number."], SamplingParams(max_tokens=250, ignore_eos=True), chat=True)
layer._state["stack"] = orig
a = cap[n_rows]
for _ in range(10): orig(*a)
print("go", flush=True)
ts = []
for _ in range(reps):
    t0 = time.perf_counter(); orig(*a); ts.append(time.perf_counter() - t0)
print(f"{n_rows} rows: median {statistics.median(ts)*1e3:.3f} ms")
