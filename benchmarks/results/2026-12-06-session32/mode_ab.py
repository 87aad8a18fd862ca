# python mode_ab.py ROWS: 30 layers' bf16 linears, AMXM=0 (two tile sets) / 1 (one set, base+1 rows) alternated
# the scratch build: `git show 712e4ae:plugins/csrc/invariant.cpp` with amxm_switch.patch applied, in /tmp/pf2 beside
# copies of plugins/csrc/*.h, *.cuh and invariant_layer.cpp (AMXM=0: two tile sets as 712e4ae, its blocks in
# the new order; AMXM=1: one set, as 9d437ab)
import torch, time, statistics, sys, os
torch.set_num_threads(2)
from dflash_trt.plugins import invariant as inv
inv._SOURCE = "/tmp/pf2/invariant.cpp"
inv.load()
torch.manual_seed(0)
H, I = 576, 1536
ws = {"qkv": torch.randn(576 + 2*192, H), "o": torch.randn(H, H), "gu": torch.randn(2*I, H), "down": torch.randn(H, I)}
packs = [{n: inv.pack_linear_bf16_pairs(w.clone() * 0.02) for n, w in ws.items()} for _ in range(30)]
R = [int(r) for r in sys.argv[1].split(",")]
xs = {r: {n: torch.randn(r, w.shape[1]).to(torch.bfloat16) for n, w in ws.items()} for r in R}
ts = {(r, m): [] for r in R for m in "01"}
ref = {}
for it in range(10):
    for r in R:
        for m in "01":
            os.environ["AMXM"] = m
            t0 = time.perf_counter()
            ys = [inv.linear(xs[r][n], p[n]) for p in packs for n in ws]
            ts[(r, m)].append(time.perf_counter() - t0)
            if it == 0:
                if m == "0": ref[r] = ys
                else: assert all(torch.equal(a, b) for a, b in zip(ref[r], ys)), r
for r in R:
    a, b = statistics.median(ts[(r, "0")]) * 1e3, statistics.median(ts[(r, "1")]) * 1e3
    print(f"rows {r}: two sets {a:.2f} one set {b:.2f} ratio {b / a:.3f}", flush=True)
