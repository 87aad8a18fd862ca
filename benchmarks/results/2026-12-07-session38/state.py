# captured stack calls, 1 and 8 rows, timed in blocks over time; ping-pong latency between blocks; THP of the process
import sys, time, statistics, subprocess, torch
torch.set_num_threads(2)
import os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stack_calls import capture
dt, wts, blocks = sys.argv[1], sys.argv[2], int(sys.argv[3])
orig, spec, ar = capture(dt, wts)
c1, c8 = ar[1][-20:], spec[8][-20:]
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
