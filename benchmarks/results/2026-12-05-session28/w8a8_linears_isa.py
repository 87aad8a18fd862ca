# python w8a8_linears_isa.py   (the "1 row amx" column runs VNNI too: tiles start at 8 rows)
# 30 layers' linears of SmolLM2-135M (qkv, o, gate/up, down) as W8A8 panels (no head): VNNI (avx512) vs AMX-INT8
import time, torch
from dflash_trt.plugins import invariant as bi
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30
packs = [bi.pack_linear_w8a8(torch.randn(n, k, generator=g) * 0.05) for n, k in shapes]
def run(rows, isa):
    bi.set_isa(isa)
    xs = {k: torch.randn(rows, k, generator=g).to(torch.bfloat16) for k in (576, 1536)}
    best = 1e9
    for _ in range(9):
        t0 = time.perf_counter()
        for (n, k), p in zip(shapes, packs):
            bi.linear(xs[k], p)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3
for rnd in range(2):
    print(f"1 row vnni {run(1, 'avx512'):.2f} amx {run(1, 'amx'):.2f} | 8 rows vnni {run(8, 'avx512'):.2f} "
          f"amx {run(8, 'amx'):.2f} | 16 rows vnni {run(16, 'avx512'):.2f} amx {run(16, 'amx'):.2f} ms", flush=True)
