# python pair_noise.py DTYPE: the spread of a target pass's cost ratio (12 rows of 4 requests / 4 rows of 4) measured
# from adjacent passes (ref, point, ref: the point over the mean of its two refs), 40 times, against the ratio of
# the two passes taken as a calibration round takes them (each from its own round's figures)
import os, sys, statistics
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scratch_passes import timed_passes
passes = timed_passes(sys.argv[1], 4)


def run(drafts):  # the 4 scratch requests
    return passes(4, drafts)


for _ in range(3): run(0); run(2)
r = []
for i in range(40):
    a = run(0); b = run(2); c = run(0)
    r.append(b / ((a + c) / 2))
q = statistics.quantiles(r, n=10)
print(f"T(12)/T(4) from adjacent passes: median {statistics.median(r):.3f}, 10-90% {q[0]:.3f}-{q[-1]:.3f}")
meds = [statistics.median(r[i:i + 5]) for i in range(0, 40, 5)]
print("medians of 5:", " ".join(f"{m:.3f}" for m in meds))
