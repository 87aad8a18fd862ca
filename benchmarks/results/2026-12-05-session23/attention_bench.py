import torch, time, sys
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
from dflash_trt.plugins import invariant as bi
ops = bi._ops()
T, H, KVH, D, L = 8, 9, 3, 64, int(sys.argv[2]) if len(sys.argv) > 2 else 290
dt = torch.bfloat16
q = torch.randn(T, H, D).to(dt)
S = 512
kc = torch.randn(S, KVH, D).to(dt); vc = torch.randn(S, KVH, D).to(dt)
slots = torch.randperm(S)[:L].sort().values
for T in (1, 8):
    qq = q[:T].contiguous()
    args = (qq, kc, vc, torch.tensor([0]), torch.tensor([T]), torch.tensor([L]), slots, torch.tensor([0]), 0.125, True)
    for _ in range(50): ops.bi_paged_attention(*args)
    n = 2000; t0 = time.perf_counter()
    for _ in range(n): ops.bi_paged_attention(*args)
    dt_ = (time.perf_counter() - t0) / n
    mac = T * H * L * D * 2
    print(f"T={T}: {dt_*1e6:.1f} us/call, x30 = {dt_*30e3:.2f} ms, {mac/dt_/1e9:.1f} GMAC/s")
