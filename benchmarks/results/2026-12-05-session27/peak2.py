# 8-row bf16 k-pair linears at 2 threads over total weight sizes from L2 to DRAM: GFLOP/s and GB/s
import sys, time, torch
import dflash_trt.plugins.invariant as inv
inv.load()
op = inv.binding("bi_linear")
torch.set_num_threads(2)
K = 576
for N, cnt in ((1024, 1), (3072, 4), (3072, 16), (3072, 64)):
    ps = [inv.pack_linear_bf16_pairs(torch.randn(N, K) * 0.05) for _ in range(cnt)]
    mb = N * K * 2 * cnt / 1e6
    out = []
    for r in (1, 8):
        x = torch.randn(r, K).to(torch.bfloat16)
        reps = max(1, int(400 / mb))
        best = 1e9
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                for p in ps: op(x, p.data, p.n, None, 1, p.scale)
            best = min(best, (time.perf_counter() - t0) / reps)
        out.append(f"r{r} {best*1e3:7.3f}ms {2*N*K*r*cnt/best/1e9:5.0f}GF {mb/1e3/best:5.1f}GB/s")
    print(f"{mb:7.1f} MB: " + "  ".join(out), flush=True)
