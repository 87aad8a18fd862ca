# python linears_cold.py w8a8|bf16: the 30 layers' four linears (random weights of SmolLM2's shapes, streamed from memory) at one
# row and at eight, interleaved, 60 passes each; medians. (bf16 here packs with pack_linear(w, torch.bfloat16), which is not
# the engine's bf16 k-pair path: read only the w8a8 line)
import sys, time, torch, statistics, os
torch.set_num_threads(2)
from dflash_trt.plugins import invariant as bi
bi.load()
torch.manual_seed(0)
kind = sys.argv[1]
H, I = 576, 1536
pk = (lambda n, k: bi.pack_linear_w8a8(torch.randn(n, k) * 0.05)) if kind == "w8a8" else (lambda n, k: bi.pack_linear(torch.randn(n, k) * 0.05, torch.bfloat16))
layers = [(pk(960, H), pk(H, H), pk(2 * I, H), pk(H, I)) for _ in range(30)]
xs = {M: (torch.randn(M, H).to(torch.bfloat16), torch.randn(M, I).to(torch.bfloat16)) for M in (1, 8)}
def fwd(M):
    x, xi = xs[M]
    for qkv, o, gu, dn in layers:
        bi.linear(x, qkv); bi.linear(x, o); bi.linear(x, gu); bi.linear(xi, dn)
ts = {1: [], 8: []}
for r in range(60):
    for M in (1, 8):
        t0 = time.perf_counter(); fwd(M); ts[M].append(time.perf_counter() - t0)
a, b = statistics.median(ts[1]) * 1e3, statistics.median(ts[8]) * 1e3
print(f"{kind}: 30 layers' linears, 1 row {a:.2f} ms, 8 rows {b:.2f} ms, +{b - a:.2f} ({b / a:.2f}x)")
