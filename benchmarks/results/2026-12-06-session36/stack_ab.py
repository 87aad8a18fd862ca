# python stack_ab.py DTYPE WEIGHTS: the fused decoder stack (30 layers) on calls captured from decoding, one row (AR)
# and eight (a K = 7 verify block) interleaved, 200 each; medians
# the fused stack's captured calls, 1 vs 8 rows interleaved (weights stream from memory either way)
import sys, time, statistics, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.plugins import layer
dt, wts = sys.argv[1], sys.argv[2]
t, d = embedded_paths()
llm = LLM(target=t, dtype=dt, weights=wts, draft=d, draft_len_policy="fixed", max_draft_len=7)
layer.load()
orig = layer._state["stack"]
cap = {}
def wrap(*a):
    if len(a[4]) == 30: cap.setdefault(a[1].shape[0], []).append(a)
    return orig(*a)
layer._state["stack"] = wrap
llm.generate(["Write a Python function that returns the n-th Fibonacci number."], SamplingParams(max_tokens=200, ignore_eos=True), chat=True)
llm2 = LLM(target=t, dtype=dt, weights=wts, speculative=False)
llm2.generate(["Write a Python function that returns the n-th Fibonacci number."], SamplingParams(max_tokens=60, ignore_eos=True), chat=True)
layer._state["stack"] = orig
ts = {1: [], 8: []}
c1, c8 = cap[1][-20:], cap[8][-20:]
for i in range(200):
    for n, calls in ((1, c1), (8, c8)):
        a = calls[i % 20]
        t0 = time.perf_counter(); orig(*a); ts[n].append(time.perf_counter() - t0)
a, b = statistics.median(ts[1]) * 1e3, statistics.median(ts[8]) * 1e3
print(f"{dt} {wts}: stack 1 row {a:.3f} ms, 8 rows {b:.3f} ms, +{b - a:.3f} ({b / a:.2f}x)", flush=True)
