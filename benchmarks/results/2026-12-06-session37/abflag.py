# python abflag.py DTYPE WEIGHTS N [OPS]: captured stack calls, 1 and 8 rows, flag off/on alternating per call; medians.
# OPS: the A/B build's switches, comma-separated (default bi_set_ab), each an op given the flag, or op=OFF:ON, an op
# given the string OFF or ON (bi_set_pairs=dp:mixed); PP=path: run that round-trip probe at the end
import sys, time, statistics, torch
torch.set_num_threads(2)
import os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stack_calls import capture
dt, wts, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
ops = (sys.argv[4] if len(sys.argv) > 4 else "bi_set_ab").split(",")
def switch(on):
    for o in ops:
        name, _, vals = o.partition("=")
        getattr(torch.ops.dflash_trt, name)(vals.split(":")[on] if vals else on)
orig, spec, ar = capture(dt, wts)
ts = {(r, f): [] for r in (1, 8) for f in (0, 1)}
c1, c8 = ar[1][-20:], spec[8][-20:]
for i in range(N):
    for f in ((0, 1) if i % 2 else (1, 0)):
        switch(bool(f))
        for n, calls in ((1, c1), (8, c8)):
            a = calls[i % 20]
            t0 = time.perf_counter(); orig(*a); ts[(n, f)].append(time.perf_counter() - t0)
switch(True)
m = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
for f in (0, 1):
    print(f"{dt} {wts} flag {f}: 1 row {m[(1, f)]:.3f} ms, 8 rows {m[(8, f)]:.3f} ms, ratio {m[(8, f)] / m[(1, f)]:.3f}")
print(f"  new/old: 1 row {m[(1,1)]/m[(1,0)]:.3f}, 8 rows {m[(8,1)]/m[(8,0)]:.3f}", flush=True)
pp = os.environ.get("PP")  # a round-trip probe (session 38's pp.c) to run after the measurement
if pp:
    import subprocess
    print(subprocess.run([pp, "1"], capture_output=True, text=True).stdout.strip(), flush=True)
