# python ablate.py DTYPE WEIGHTS N MASKS...: 8-row captured stack calls with parts skipped (mask bits), interleaved
import sys, time, statistics, torch
torch.set_num_threads(2)
import os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stack_calls import capture
dt, wts, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
masks = [0] + [int(m) for m in sys.argv[4:]]
orig, spec, ar = capture(dt, wts)
c1, c8 = ar[1][-20:], spec[8][-20:]
ts = {m: [] for m in masks}; t1 = []
for i in range(N):
    torch.ops.dflash_trt.bi_set_ab(0)
    a = c1[i % 20]; t0 = time.perf_counter(); orig(*a); t1.append(time.perf_counter() - t0)
    for m in (masks if i % 2 else masks[::-1]):
        torch.ops.dflash_trt.bi_set_ab(m)
        a = c8[i % 20]
        t0 = time.perf_counter(); orig(*a); ts[m].append(time.perf_counter() - t0)
torch.ops.dflash_trt.bi_set_ab(0)
b1 = statistics.median(t1) * 1e3
base = statistics.median(ts[0]) * 1e3
print(f"{dt} {wts}: 1 row {b1:.3f} ms; 8 rows {base:.3f} ms ({base / b1:.3f})")
for m in masks[1:]:
    v = statistics.median(ts[m]) * 1e3
    print(f"  skip mask {m:3d}: 8 rows {v:.3f} ms, saves {base - v:+.3f} ms ({v / b1:.3f})")
