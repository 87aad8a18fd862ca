# python rows_ab.py ROWS [bf16|w8a8]: 30 layers' linears at each row count, interleaved inside the process; medians
import torch, time, statistics, sys, os
torch.set_num_threads(2)
from dflash_trt.plugins import invariant as inv
if os.environ.get("SRC"): inv._SOURCE = os.environ["SRC"]
inv.load()
torch.manual_seed(0)
H, I = 576, 1536
ws = {"qkv": torch.randn(576 + 2*192, H), "o": torch.randn(H, H), "gu": torch.randn(2*I, H), "down": torch.randn(H, I)}
pk = inv.pack_linear_bf16_pairs if (sys.argv[2] if len(sys.argv) > 2 else "bf16") == "bf16" else inv.pack_linear_w8a8
packs = [{n: pk(w.clone() * 0.02) for n, w in ws.items()} for _ in range(30)]
R = [int(r) for r in sys.argv[1].split(",")]
xs = {r: {n: torch.randn(r, w.shape[1]).to(torch.bfloat16) for n, w in ws.items()} for r in R}
ts = {r: [] for r in R}
for it in range(12):
    for r in R:
        t0 = time.perf_counter()
        for p in packs:
            for n in ws:
                inv.linear(xs[r][n], p[n])
        ts[r].append(time.perf_counter() - t0)
print(" | ".join(f"{r}: {statistics.median(ts[r])*1e3:.2f}" for r in R), flush=True)
