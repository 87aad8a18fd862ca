# python forward_replay.py ROWS SECONDS [WEIGHTS]: bf16 1 / 8 rows gave 13.13 / 12.81 ms; w8a8 (final) 6.01 / 9.59 ms
# Replays captured target forwards of a bf16 decode (1-row AR steps and 8-row verify steps) to time / perf them.
# python fwdprof.py ROWS SECONDS  (prints PHASE when the replay loop starts, for perf to attach)
import sys, time, statistics, os, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
rows, secs = int(sys.argv[1]), float(sys.argv[2])
W = sys.argv[3] if len(sys.argv) > 3 else "auto"
t, d = embedded_paths()
l = LLM(target=t, draft=d, dtype="bfloat16", weights=W, draft_len_policy="fixed") if rows > 1 else \
    LLM(target=t, dtype="bfloat16", weights=W, speculative=False)
tg = l.engine.target
cap = []
f = tg.forward
def g(*a, **k):
    cap.append((a, k)); return f(*a, **k)
tg.forward = g
l.generate(["Explain how a hash map handles collisions."], SamplingParams(max_tokens=96, ignore_eos=True), chat=True)
tg.forward = f
def nrows(a):
    return a[0][0].shape[0]
calls = [c for c in cap if nrows(c) == rows][-20:]
print("captured", len(calls), "of", len(cap), [nrows(c) for c in cap[:5]], flush=True)
print("PHASE", os.getpid(), flush=True)
ts = []
t_end = time.time() + secs
while time.time() < t_end:
    for a, k in calls:
        t0 = time.perf_counter(); f(*a, **k); ts.append(time.perf_counter() - t0)
print(f"rows {rows}: forward median {statistics.median(ts) * 1e3:.2f} ms over {len(ts)}", flush=True)
