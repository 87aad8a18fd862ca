# python capture_ab.py
# In-process: the target forward of captured c=32 DFlash steps (fp32), replayed with capture on / off, alternating.
import sys, time, statistics, torch
sys.path.insert(0, "/work/main/benchmarks")
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
t, d = embedded_paths()
sd = LLM(target=t, draft=d, speculative=True, draft_len_policy="adaptive", max_batch_size=32, dtype="float32")
tg = sd.engine.target
cap = []
f = tg.forward
def g(*a, **k):
    cap.append((a, dict(k))); return f(*a, **k)
tg.forward = g
loop = ClosedLoop(sd, PROMPTS[:32], 32, 64)
while loop.busy: loop.step()
tg.forward = f
calls = [(a, k) for a, k in cap if a[0].shape[0] >= 24][-20:]
print("calls", len(calls), "rows", [a[0].shape[0] for a, _ in calls][:5], "capture", [k.get("capture") for _, k in calls][:3])
res = {True: [], False: []}
for rnd in range(6):
    for c in (True, False):
        t0 = time.perf_counter()
        for a, k in calls:
            k2 = dict(k); k2["capture"] = c
            if len(a) > 4: a = a[:4]
            f(*a, **k2)
        res[c].append((time.perf_counter() - t0) / len(calls))
for c in (True, False):
    print(f"capture {c}: median {statistics.median(res[c]) * 1e3:.2f} ms per forward ({', '.join(f'{x*1e3:.2f}' for x in res[c])})")
