import torch, time
import sys; torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
from dflash_trt.plugins import invariant as bi
bi.load()
K = 576
def mk(n): return bi.pack_linear(torch.randn(n, K, dtype=torch.bfloat16), torch.bfloat16)
x = torch.randn(1, K, dtype=torch.bfloat16)
small = [mk(3072) for _ in range(60)]        # 60 x 3.5 MB
mid = [mk(960) for _ in range(190)]           # 190 x 1.1 MB
big = [mk(3072 * 60)]                         # one 212 MB
import torch.nn as nn
from dflash_trt.huge_pages import move_to_huge_pages, thp_mode
class Hold(nn.Module):
    def __init__(self, ws):
        super().__init__()
        for i, w in enumerate(ws): setattr(self, f"w{i}", w)
if len(sys.argv) > 2:
    print("thp", thp_mode(), "moved MB", sum(move_to_huge_pages(Hold(ws)) for ws in (small, mid, big)) / 1e6)
def run(ws):
    for w in ws: bi.linear(x, w)
for name, ws in (("big", big), ("small", small), ("mid", mid), ("big", big), ("small", small), ("mid", mid)):
    byt = sum(w.data.numel() * w.data.element_size() for w in ws)
    run(ws)
    best = 1e9
    for _ in range(8):
        t0 = time.perf_counter(); run(ws); best = min(best, time.perf_counter() - t0)
    print(f"{name}: {len(ws)} calls, {byt/1e6:.0f} MB, {best*1e3:.2f} ms, {byt/best/1e9:.1f} GB/s, {best/len(ws)*1e6:.1f} us/call")
x = torch.randn(128 << 20, dtype=torch.float32)
best = min((lambda: (lambda t0: (x.sum(), time.perf_counter() - t0)[1])(time.perf_counter()))() for _ in range(5))
print(f"torch.sum 512MB: {512*1.048576/best/1e3:.1f} GB/s")
