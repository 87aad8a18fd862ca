# python attention_rows.py [OLD/invariant.cpp]: bi_paged_attention of a bf16 model (9 heads, 3 KV heads, D 64) per
# call, us (median), 1 and 2 threads, 150 and 600 keys, 1-16 query rows (the fixed cost of a call from Python
# included)
import sys, time, torch, statistics
from dflash_trt.plugins import invariant as bi
if len(sys.argv) > 1:
    bi._SOURCE = sys.argv[1]
bi.load()
torch.manual_seed(0)
D, NH, KVH = 64, 9, 3
bf = torch.bfloat16
S = 4096
kc = torch.randn(S, KVH, D).to(bf); vc = torch.randn(S, KVH, D).to(bf)
def T(f, n=400):
    for _ in range(30): f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6
for th in (1, 2):
    torch.set_num_threads(th)
    for L in (150, 600):
        row = []
        for M in (1, 2, 4, 8, 16):
            q = torch.randn(M, NH, D).to(bf)
            sm, qs, ql, kl, sl, ko = bi.attention_args([M], [L], list(range((L + 15) // 16)), 16)
            row.append(T(lambda: bi.paged_attention(q, kc, vc, qs, ql, kl, sl, ko, 0.125, True)))
        print(f"threads {th} L {L}: " + " ".join(f"M{m}={t:.1f}" for m, t in zip((1, 2, 4, 8, 16), row)), flush=True)
