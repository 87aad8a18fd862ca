# python abpf.py N near,far near,far ...: captured stack calls, 1 and 8 rows, prefetch distances rotated per call; medians
import sys, time, statistics, subprocess, torch
torch.set_num_threads(2)
import os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stack_calls import capture
N = int(sys.argv[1]); sets = [tuple(int(v) for v in a.split(",")) for a in sys.argv[2:]]
orig, spec, ar = capture("bfloat16", os.environ.get("W", "w8a8"))
ts = {(r, s): [] for r in (1, 8) for s in sets}
c1, c8 = ar[1][-20:], spec[8][-20:]
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
