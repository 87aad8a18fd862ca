# python lin_ab.py THREADS MATS: one bf16 k-pair linear (576 -> 1536) at 1 and 8 rows, vdpbf16ps ('dp') against
# two fmas ('fma': every row) alternating per call; MATS 1: hot, 200: cold (a different matrix per call). Medians.
import sys, time, statistics, torch
from dflash_trt.plugins import invariant as inv
torch.set_num_threads(int(sys.argv[1]))
inv.load()
N, K = 1536, 576
ws = [inv.pack_linear_bf16_pairs(torch.randn(N, K)) for _ in range(int(sys.argv[2]))]  # count: hot (1) or cold (many)
for M in (1, 8):
    x = torch.randn(M, K).to(torch.bfloat16)
    ts = {0: [], 1: []}
    for i in range(40):
        for f in ((0, 1) if i % 2 else (1, 0)):
            inv.set_pairs('fma' if f else 'dp')
            t0 = time.perf_counter()
            for w in ws: inv.linear(x, w)
            ts[f].append((time.perf_counter() - t0) / len(ws))
    m = {f: statistics.median(v) * 1e6 for f, v in ts.items()}
    print(f"threads {sys.argv[1]} mats {sys.argv[2]} M {M}: dp {m[0]:.1f} us, fma {m[1]:.1f} us, fma/dp {m[1]/m[0]:.3f}")
