# python capture_ab.py DTYPE N: one DFlash engine's target pass of N one-row requests with the drafter's features
# captured and not, alternated (median of 40 pairs), and the observe that queues them
import os, sys, time, statistics, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-session33"))
from scratch_passes import timed_passes
import scratch_passes as sp
dt, N = sys.argv[1], int(sys.argv[2])
captured = {}
orig = sp.LLM
def grab(*a, **k):
    llm = orig(*a, **k); captured["e"] = llm.engine; return llm
sp.LLM = grab
run = timed_passes(dt, N)
r = captured["e"].runner
on, off = [], []
for i in range(50):
    r.capture = True; a = run(N, 0)
    r.capture = False; b = run(N, 0)
    if i >= 10: on.append(a); off.append(b)
print(f"{dt} {N} rows: captured {statistics.median(on) * 1e3:.3f} ms, not {statistics.median(off) * 1e3:.3f} ms, "
      f"difference {(statistics.median(on) - statistics.median(off)) * 1e3:+.3f} ms")
