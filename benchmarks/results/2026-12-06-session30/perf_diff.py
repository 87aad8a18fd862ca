# python perf_diff.py 1ROW_MS 8ROW_MS: the per-symbol samples of perf_w8a8_{1row,8rows}_symbols.txt (perf report
# --no-children --sort sym of a replayed W8A8 target forward, 2 threads, 8 s:
# `python ../2026-12-06-session29/ratio_same.py new 20 w8a8 1` and `... 8`, perf attached after PHASE) as thread-ms per forward (share x 2 threads x the replay's median), and
# their difference, largest first
import collections, os, re, sys
here = os.path.dirname(os.path.abspath(__file__))
med = {1: float(sys.argv[1]), 8: float(sys.argv[2])}
d = {}
for r, name in ((1, "1row"), (8, "8rows")):
    c = collections.Counter()
    for line in open(os.path.join(here, f"perf_w8a8_{name}_symbols.txt")):
        p = line.split()
        if len(p) >= 2:
            c[re.sub(r"<[^>]*>", "<>", " ".join(p[1:]))] += float(p[0])
    d[r] = {k: v / 100 * 2 * med[r] for k, v in c.items()}
keys = sorted(set(d[1]) | set(d[8]), key=lambda k: -(d[8].get(k, 0) - d[1].get(k, 0)))
print(f"{'symbol':60s} {'1 row':>8s} {'8 rows':>8s} {'diff':>7s}  (thread-ms per forward)")
for k in keys[:20] + keys[-3:]:
    print(f"{k[:60]:60s} {d[1].get(k, 0):8.3f} {d[8].get(k, 0):8.3f} {d[8].get(k, 0) - d[1].get(k, 0):7.3f}")
print(f"{'total':60s} {sum(d[1].values()):8.3f} {sum(d[8].values()):8.3f}")
