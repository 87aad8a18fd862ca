# python abflag.py DTYPE WEIGHTS N [OPS]: captured stack calls, 1 and 8 rows, flag off/on alternating per call; medians.
# OPS: the A/B build's switches, comma-separated (default bi_set_ab), each an op given the flag, or op=OFF:ON, an op
# given the string OFF or ON (bi_set_pairs=dp:mixed); PP=path: run that round-trip probe at the end
import sys, time, statistics, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.plugins import layer
dt, wts, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
ops = (sys.argv[4] if len(sys.argv) > 4 else "bi_set_ab").split(",")
def switch(on):
    for o in ops:
        name, _, vals = o.partition("=")
        getattr(torch.ops.dflash_trt, name)(vals.split(":")[on] if vals else on)
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
llm2.generate(["Write a Python function that returns the n-th Fibonacci number."], SamplingParams(max_tokens=200, ignore_eos=True), chat=True)
layer._state["stack"] = orig
ts = {(r, f): [] for r in (1, 8) for f in (0, 1)}
c1, c8 = cap[1][-20:], cap[8][-20:]
for i in range(N):
    for f in ((0, 1) if i % 2 else (1, 0)):
        switch(bool(f))
        for n, calls in ((1, c1), (8, c8)):
            a = calls[i % 20]
            t0 = time.perf_counter(); orig(*a); ts[(n, f)].append(time.perf_counter() - t0)
switch(True)
m = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
for f in (0, 1):
    print(f"{dt} {wts} flag {f}: 1 row {m[(1, f)]:.3f} ms, 8 rows {m[(8, f)]:.3f} ms, ratio {m[(8, f)] / m[(1, f)]:.3f}")
print(f"  new/old: 1 row {m[(1,1)]/m[(1,0)]:.3f}, 8 rows {m[(8,1)]/m[(8,0)]:.3f}", flush=True)
pp = __import__("os").environ.get("PP")  # a round-trip probe (session 38's pp.c) to run after the measurement
if pp:
    import subprocess
    print(subprocess.run([pp, "1"], capture_output=True, text=True).stdout.strip(), flush=True)
