# python batch_replay.py SECONDS ROWSLIST: capture 16-request AR forwards (16 rows) and 16-request K=1 DFlash
# verify forwards (32 rows) of the bf16 embedded target, replay alternately; medians
import sys, time, statistics, os, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
secs = float(sys.argv[1]); ONLY = [int(v) for v in sys.argv[2].split(",")]
t, d = embedded_paths()
P = ["Explain how a hash map handles collisions.", "Write a haiku about the sea.", "What is the capital of France and why?",
     "List three uses of copper.", "Describe photosynthesis briefly.", "How do I reverse a list in Python?",
     "Tell me a short story about a fox.", "What causes rain?"] * 2
def capture(llm, rows):
    tg = llm.engine.target
    cap, f = [], tg.forward
    def g(*a, **k):
        cap.append((a, k)); return f(*a, **k)
    tg.forward = g
    llm.generate(P, SamplingParams(max_tokens=48, ignore_eos=True), chat=True)
    tg.forward = f
    sizes = sorted(set(c[0][0].shape[0] for c in cap))
    print("captured sizes", sizes[:20], flush=True)
    return [c for c in cap if c[0][0].shape[0] == rows][-10:]
sd = LLM(target=t, draft=d, dtype="bfloat16", draft_len_policy="fixed", max_draft_len=1, max_batch_size=32)
f = sd.engine.target.forward
calls = {}
if 32 in ONLY: calls[32] = capture(sd, 32)
ar = LLM(target=t, dtype="bfloat16", speculative=False, max_batch_size=32)
for r in ONLY:
    if r != 32: calls[r] = capture(ar, r)
ts = {r: [] for r in ONLY}
print("PHASE", flush=True)
t_end = time.time() + secs
while time.time() < t_end:
    for r in ONLY:
        for a, k in calls[r]:
            t0 = time.perf_counter(); f(*a, **k); ts[r].append(time.perf_counter() - t0)
print(" ".join(f"{r} rows {statistics.median(ts[r])*1e3:.2f} ms" for r in ONLY), flush=True)
