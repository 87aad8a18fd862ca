# python pass_rows.py DTYPE: target pass ms (median of 15) for n requests x (drafts + 1) rows
import os, sys, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-session33"))
from scratch_passes import timed_passes
run = timed_passes(sys.argv[1], 32)
cases = [(1, 0), (1, 1), (1, 7), (4, 0), (4, 1), (4, 2), (8, 0), (16, 0), (8, 1), (16, 1), (32, 0), (16, 2)]
for c in cases * 2: run(*c)
res = {c: [] for c in cases}
for _ in range(15):
    for c in cases: res[c].append(run(*c))
base = statistics.median(res[(1, 0)])
for c in cases:
    m = statistics.median(res[c])
    print(f"{c[0]:3d} req x {c[1] + 1} rows = {c[0] * (c[1] + 1):3d} rows: {m * 1e3:7.2f} ms  {m / base:5.2f} T(1)")
