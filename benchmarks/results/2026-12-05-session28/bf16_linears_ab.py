# python bf16_linears_ab.py
# 30 layers' linears of SmolLM2-135M (qkv 576->960, o 576->576, gate/up 576->3072, down 1536->576) + head
# 49152x576, bf16 weights: widened panels on avx512 (before) vs k-pairs on amx tiles (after); cold weights.
import time, torch
from dflash_trt.plugins import invariant as bi
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]
ws = [torch.randn(n, k, generator=g).to(torch.bfloat16) * 0.05 for n, k in shapes]
wide = [bi.pack_linear(w, torch.bfloat16) for w in ws]
pairs = [bi.pack_linear_bf16_pairs(w) for w in ws]
def run(packs, rows, isa):
    bi.set_isa(isa)
    xs = {k: torch.randn(rows, k, generator=g).to(torch.bfloat16) for k in (576, 1536)}
    best = 1e9
    for _ in range(7):
        t0 = time.perf_counter()
        for (n, k), p in zip(shapes, packs):
            bi.linear(xs[k], p)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3
for rnd in range(2):
    for rows in (1, 8, 16):
        a = run(wide, rows, "avx512"); b = run(pairs, rows, "amx")
        print(f"rows {rows:2d}: widened/avx512 {a:6.2f} ms   pairs/amx {b:6.2f} ms   ratio {a / b:.2f}", flush=True)
