import torch, time, sys
torch.set_num_threads(2)
from dflash_trt.plugins import invariant as bi
ops = bi._ops()
H, KVH, D, L, S = 9, 3, 64, 290, 512
q = torch.randn(8, H, D).to(torch.bfloat16)
kc = torch.randn(S, KVH, D).to(torch.bfloat16); vc = torch.randn(S, KVH, D).to(torch.bfloat16)
slots = torch.randperm(S)[:L].sort().values
for T in (1, 8):
    res = {}
    for name, qq in (("bf16 q (pairs)", q[:T].contiguous()), ("fp32 q (slices)", q[:T].float().contiguous())):
        args = (qq, kc, vc, torch.tensor([0]), torch.tensor([T]), torch.tensor([L]), slots, torch.tensor([0]), 0.125, True)
        for _ in range(50): ops.bi_paged_attention(*args)
        best = 1e9
        for r in range(5):
            n = 1000; t0 = time.perf_counter()
            for _ in range(n): ops.bi_paged_attention(*args)
            best = min(best, (time.perf_counter() - t0) / n)
        res[name] = ops.bi_paged_attention(*args)
        print(f"T={T} {name}: {best*1e6:.1f} us/call")
    a, b = res.values()
    print("  max |diff| (fp32 outputs)", (a.float() - b.float()).abs().max().item())
