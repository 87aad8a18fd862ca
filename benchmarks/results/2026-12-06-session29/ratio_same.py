# python ratio_same.py new|OLD/invariant.cpp SECONDS WEIGHTS [1|8|1,8]: the 1-row forwards of an AR decode and the
# 8-row verify forwards of a DFlash decode, captured, then replayed alternately (blocks of 10) on the DFlash
# engine's target (one set of weights, as warm in cache for both): medians and their ratio. OLD: `git show
# REV:plugins/csrc/invariant.cpp` (and invariant_layer.cpp) saved beside copies of plugins/csrc's headers (the
# build cache is keyed by all of them). The fourth argument replays only those rows (session 30: for perf, which
# attaches after the PHASE line); CH=N sets the greedy screen's chunks.
import sys, time, statistics, os, torch
torch.set_num_threads(2)
from dflash_trt.plugins import invariant as inv
if sys.argv[1] != "new":  # that revision's layer op too, where invariant_layer.cpp is beside it
    inv._SOURCE = sys.argv[1]
    from dflash_trt.plugins import layer
    old_layer = os.path.join(os.path.dirname(sys.argv[1]), "invariant_layer.cpp")
    if os.path.exists(old_layer):
        layer._SOURCE = old_layer
inv.load()
import dflash_trt.greedy_head as gh
gh.CHUNKS = int(os.environ.get("CH", "8"))
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
secs, W = float(sys.argv[2]), sys.argv[3]
ONLY = [int(v) for v in sys.argv[4].split(",")] if len(sys.argv) > 4 else [1, 8]
t, d = embedded_paths()
def capture(llm, rows):
    tg = llm.engine.target
    cap, f = [], tg.forward
    def g(*a, **k):
        cap.append((a, k)); return f(*a, **k)
    tg.forward = g
    llm.generate(["Explain how a hash map handles collisions."], SamplingParams(max_tokens=96, ignore_eos=True),
                 chat=True)
    tg.forward = f
    return f, [c for c in cap if c[0][0].shape[0] == rows][-10:]
ar = LLM(target=t, dtype="bfloat16", weights=W, speculative=False)
sd = LLM(target=t, draft=d, dtype="bfloat16", weights=W, draft_len_policy="fixed")
f1, c1 = capture(ar, 1)
import gc
f1 = sd.engine.target.forward  # the 1-row calls run on the DFlash engine's target: one set of weights hot
f8, c8 = capture(sd, 8)
ts = {1: [], 8: []}
print("PHASE", flush=True)
t_end = time.time() + secs
while time.time() < t_end:
    for f, calls, r in [x for x in ((f1, c1, 1), (f8, c8, 8)) if x[2] in ONLY]:
        for a, k in calls:
            t0 = time.perf_counter(); f(*a, **k); ts[r].append(time.perf_counter() - t0)
m1, m8 = [statistics.median(ts[r]) * 1e3 if ts[r] else float("nan") for r in (1, 8)]
print(f"{sys.argv[1][-24:]} {W}: 1 row {m1:.2f} ms, 8 rows {m8:.2f} ms, ratio {m8 / m1:.3f}", flush=True)
