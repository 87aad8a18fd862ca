# python abpf.py N near,far near,far ...: captured stack calls, 1 and 8 rows, prefetch distances rotated per call; medians
import sys, time, statistics, subprocess, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.plugins import layer
N = int(sys.argv[1]); sets = [tuple(int(v) for v in a.split(",")) for a in sys.argv[2:]]
t, d = embedded_paths()
llm = LLM(target=t, dtype="bfloat16", weights=__import__("os").environ.get("W", "w8a8"), draft=d, draft_len_policy="fixed", max_draft_len=7)
layer.load()
orig = layer._state["stack"]
cap = {}
def wrap(*a):
    if len(a[4]) == 30: cap.setdefault(a[1].shape[0], []).append(a)
    return orig(*a)
layer._state["stack"] = wrap
llm.generate(["Write a Python function that returns the n-th Fibonacci number."], SamplingParams(max_tokens=200, ignore_eos=True), chat=True)
cap.pop(1, None)
llm2 = LLM(target=t, dtype="bfloat16", weights=__import__("os").environ.get("W", "w8a8"), speculative=False)
llm2.generate(["Write a Python function that returns the n-th Fibonacci number."], SamplingParams(max_tokens=200, ignore_eos=True), chat=True)
layer._state["stack"] = orig
ts = {(r, s): [] for r in (1, 8) for s in sets}
c1, c8 = cap[1][-20:], cap[8][-20:]
for i in range(N):
    order = sets[i % len(sets):] + sets[:i % len(sets)]
    for s in order:
        torch.ops.dflash_trt.bi_set_pf(*s)
        for n, calls in ((1, c1), (8, c8)):
            a = calls[i % 20]
            t0 = time.perf_counter(); orig(*a); ts[(n, s)].append(time.perf_counter() - t0)
torch.ops.dflash_trt.bi_set_pf(16, 256)
m = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
b = sets[0]
for s in sets:
    print(f"near {s[0]:4d} far {s[1]:5d}: 1 row {m[(1, s)]:.3f} ms, 8 rows {m[(8, s)]:.3f} ms; vs first 1 row {m[(1,s)]/m[(1,b)]:.3f}, 8 rows {m[(8,s)]/m[(8,b)]:.3f}")
print(subprocess.run(["/tmp/pp/pp", "1"], capture_output=True, text=True).stdout.strip(), flush=True)
