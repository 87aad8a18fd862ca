# python perf_table.py [FILE...]: perf_ab.sh outputs (thread-ms per replayed W8A8 forward by symbol) side by
# side; o = the session's starting kernels (63831cd), n = its kernels (perf_8rows_n8[ab]: after c7a9445,
# n8d and perf_1row_n1b: after the second commit). Default: the 8-row pairs, alternating old / new.
# The machine's speed moved between runs (the unchanged linq_amx moves with it): compare symbols within a file
# against linq_amx, or pairs run back to back.
import collections, os, re, sys
here = os.path.dirname(os.path.abspath(__file__))
files = sys.argv[1:] or ["perf_8rows_o8a.txt", "perf_8rows_n8a.txt", "perf_8rows_o8b.txt", "perf_8rows_n8b.txt",
                         "perf_8rows_o8c.txt", "perf_8rows_n8d.txt", "perf_1row_o1a.txt", "perf_1row_n1b.txt"]
d = {}
for f in files:
    c = collections.Counter()
    for line in open(os.path.join(here, f)):
        p = line.split()
        if len(p) >= 2:
            name = re.sub(r"<[^>]*>", "<>", " ".join(p[1:]))
            c["linear_tile (+ its epilogue)" if "linear_tile" in name else name] += float(p[0])
    d[f] = c
tags = [f.split("_")[-1][:-4] for f in files]
keys = sorted(set().union(*d.values()), key=lambda k: -d[files[0]].get(k, 0))
print(f"{'symbol':40s}", " ".join(f"{t:>6s}" for t in tags), " (thread-ms per forward)")
for k in keys[:24]:
    print(f"{k[:40]:40s}", " ".join(f"{d[f].get(k, 0):6.3f}" for f in files))
print(f"{'total':40s}", " ".join(f"{sum(d[f].values()):6.3f}" for f in files))
