# compute rate of the bf16 k-pair kernel on cache-resident weights, rows 1..16, threads 1/2
import sys, time, torch
import dflash_trt.plugins.invariant as inv
if len(sys.argv) > 1: inv._SOURCE = sys.argv[1]
inv.load()
op = inv.binding("bi_linear")
for nt in (1, 2):
    torch.set_num_threads(nt)
    for N, K in ((1024, 576), (2048, 576)):
        w = torch.randn(N, K) * 0.05
        p = inv.pack_linear_bf16_pairs(w)
        out = []
        for r in (1, 8, 12, 16):
            x = torch.randn(r, K).to(torch.bfloat16)
            for _ in range(50): op(x, p.data, p.n, None, 1, p.scale)
            best = 1e9
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(200): op(x, p.data, p.n, None, 1, p.scale)
                best = min(best, (time.perf_counter() - t0) / 200)
            out.append(f"r{r} {best*1e6:6.1f}us {2*N*K*r/best/1e9:5.0f}GF")
        print(f"nt {nt} N {N}: " + "  ".join(out))
a = torch.randn(2048, 2048).to(torch.bfloat16); b = torch.randn(2048, 2048).to(torch.bfloat16)
for nt in (1, 2):
    torch.set_num_threads(nt); a @ b
    t0 = time.perf_counter(); [a @ b for _ in range(10)]; dt = (time.perf_counter() - t0) / 10
    print(f"torch bf16 matmul nt {nt}: {2*2048**3/dt/1e9:.0f} GF")
