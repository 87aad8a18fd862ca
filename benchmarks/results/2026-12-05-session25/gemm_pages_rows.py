import time, statistics, torch
torch.set_num_threads(2)
from dflash_trt.plugins import invariant as bi
from dflash_trt.huge_pages import move_to_huge_pages
class Holder(torch.nn.Module):
    def __init__(self, packs):
        super().__init__()
        for i, p in enumerate(packs): setattr(self, f"p{i}", p)
mk = lambda: [bi.pack_linear_bf16_pairs(torch.randn(3072, 576).to(torch.bfloat16)) for _ in range(40)]
small, huge = mk(), mk()
h = Holder(huge); print("moved", move_to_huge_pages(h) >> 20, "MB")
huge = [getattr(h, f"p{i}") for i in range(40)]
res = {}
for rnd in range(4):
    for M in (1, 8):
        x = torch.randn(M, 576).to(torch.bfloat16)
        for name, ps in (("4K", small), ("2M", huge)):
            ts = []
            for _ in range(3):
                t0 = time.perf_counter(); [bi.linear(x, b) for b in ps]; ts.append(time.perf_counter() - t0)
            res.setdefault((name, M), []).append(min(ts))
for (n, M), v in res.items():
    t = statistics.median(v); print(f"{n} pages M={M}: {t*1e3:.2f} ms {141.6e-3/t:.1f} GB/s")
