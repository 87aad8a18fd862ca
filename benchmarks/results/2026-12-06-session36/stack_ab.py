# python stack_ab.py DTYPE WEIGHTS: the fused decoder stack (30 layers) on calls captured from decoding, one row (AR)
# and eight (a K = 7 verify block) interleaved, 200 each; medians
# the fused stack's captured calls, 1 vs 8 rows interleaved (weights stream from memory either way)
import sys, time, statistics, torch
torch.set_num_threads(2)
import os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stack_calls import capture
dt, wts = sys.argv[1], sys.argv[2]
orig, spec, ar = capture(dt, wts, ar_tokens=60)
ts = {1: [], 8: []}
c1, c8 = ar[1][-20:], spec[8][-20:]
for i in range(200):
    for n, calls in ((1, c1), (8, c8)):
        a = calls[i % 20]
        t0 = time.perf_counter(); orig(*a); ts[n].append(time.perf_counter() - t0)
a, b = statistics.median(ts[1]) * 1e3, statistics.median(ts[8]) * 1e3
print(f"{dt} {wts}: stack 1 row {a:.3f} ms, 8 rows {b:.3f} ms, +{b - a:.3f} ({b / a:.2f}x)", flush=True)
