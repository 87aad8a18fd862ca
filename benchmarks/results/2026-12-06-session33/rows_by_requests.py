# python rows_by_requests.py DTYPE: target passes of 32 rows as 8 requests x 4 rows (the calibration's verify point)
# and as 16 requests x 2 rows (K = 1 at 16 requests), and 16 x 1 rows, 40 rounds in turn: medians of the ratios
import os, sys, statistics
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scratch_passes import timed_passes
run = timed_passes(sys.argv[1], 16, draft_len_policy="fixed")
for _ in range(10): run(1, 7)  # arm the greedy screen
for _ in range(3): run(16, 0); run(8, 3); run(16, 1)
a, b = [], []
for i in range(40):
    w = run(16, 0); v = run(8, 3); k = run(16, 1)
    a.append(v / w); b.append(k / w)
print(f"{sys.argv[1]}: T(8 x 4)/T(16 x 1) median {statistics.median(a):.3f}; "
      f"T(16 x 2)/T(16 x 1) median {statistics.median(b):.3f};"
      f" ratio {statistics.median(b) / statistics.median(a):.3f}")
