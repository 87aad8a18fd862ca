# python lin_rows.py [OLD/invariant.cpp]: 30 layers' worth of the embedded target's bf16 linears at 1-64 rows, 2 threads
import torch, time, statistics
torch.set_num_threads(2)
from dflash_trt.plugins import invariant as inv
import sys
if len(sys.argv) > 1: inv._SOURCE = sys.argv[1]
inv.load()
torch.manual_seed(0)
H, I = 576, 1536
ws = {"qkv": torch.randn(576 + 2*192, H), "o": torch.randn(H, H), "gu": torch.randn(2*I, H), "down": torch.randn(H, I)}
# 30 layers' worth of distinct weights so nothing stays in L2
packs = [{n: inv.pack_linear_bf16_pairs(w.clone() * 0.02) for n, w in ws.items()} for _ in range(30)]
for rows in (1, 8, 16, 24, 32, 48, 64):
    xs = {n: torch.randn(rows, w.shape[1]).to(torch.bfloat16) for n, w in ws.items()}
    ts = []
    for r in range(7):
        t0 = time.perf_counter()
        for p in packs:
            for n in ws:
                inv.linear(xs[n], p[n])
        ts.append(time.perf_counter() - t0)
    print(rows, f"{statistics.median(ts)*1e3:.2f} ms for 30 layers", flush=True)
