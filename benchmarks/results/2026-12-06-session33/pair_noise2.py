# python pair_noise2.py DTYPE: target passes of 4 requests x 1, 2, 3 rows (4, 8, 12 rows), 60 rounds in turn:
# the distribution of T(8)/T(4) and T(12)/T(4) within a round (deciles), to see the calibration's spread
import os, sys, statistics
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scratch_passes import timed_passes
passes = timed_passes(sys.argv[1], 4)


def run(drafts):  # the 4 scratch requests
    return passes(4, drafts)


for _ in range(3): run(0); run(1); run(2)
r8, r12 = [], []
for i in range(60):
    a = run(0); b = run(1); c = run(2)
    r8.append(b / a); r12.append(c / a)
for name, r in (("T(8)/T(4)", r8), ("T(12)/T(4)", r12)):
    q = statistics.quantiles(r, n=10)
    print(f"{name}: median {statistics.median(r):.3f}, deciles " + " ".join(f"{x:.3f}" for x in q))
print("medians of 5 rounds, T(12)/T(4):", " ".join(f"{statistics.median(r12[i:i + 5]):.3f}" for i in range(0, 60, 5)))
print("medians of 5 rounds, T(8)/T(4): ", " ".join(f"{statistics.median(r8[i:i + 5]):.3f}" for i in range(0, 60, 5)))
