# captured stack calls, 1 and 8 rows, timed in blocks over time; ping-pong latency between blocks; THP of the process
import sys, time, statistics, subprocess, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.plugins import layer
dt, wts, blocks = sys.argv[1], sys.argv[2], int(sys.argv[3])
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
layer._state["stack"] = orig
c8 = cap[8][-20:]
cap.pop(1, None)
if True:
    llm2 = LLM(target=t, dtype=dt, weights=wts, speculative=False)
    layer._state["stack"] = wrap
    llm2.generate(["Write a Python function that returns the n-th Fibonacci number."], SamplingParams(max_tokens=200, ignore_eos=True), chat=True)
    layer._state["stack"] = orig
    c1 = cap[1][-20:]
huge = [l for l in open("/proc/self/smaps_rollup") if "AnonHuge" in l]
print(huge[0].strip() if huge else "", flush=True)
for b in range(blocks):
    ts = {1: [], 8: []}
    for i in range(100):
        for n, calls in ((1, c1), (8, c8)):
            a = calls[i % 20]
            t0 = time.perf_counter(); orig(*a); ts[n].append(time.perf_counter() - t0)
    pp = subprocess.run(["/tmp/pp/pp", "1"], capture_output=True, text=True).stdout.strip()
    m1, m8 = (statistics.median(ts[n]) * 1e3 for n in (1, 8))
    print(f"block {b}: 1 row {m1:.3f} ms, 8 rows {m8:.3f} ms, ratio {m8/m1:.3f}; {pp}", flush=True)
