# TH=1|2 python layer_ops.py M [L]: each op of one SmolLM2 W8A8 layer at M rows (weights hot), bf16 activations,
# us per call from Python (median; `empty`: a call that does nothing, the fixed cost)
import sys, time, torch, statistics
import os; torch.set_num_threads(int(os.environ.get("TH", "2")))
from dflash_trt.plugins import invariant as bi
bi.load()
M = int(sys.argv[1]); L = int(sys.argv[2]) if len(sys.argv) > 2 else 150
torch.manual_seed(0)
H, I, D, NH, KVH = 576, 1536, 64, 9, 3
bf = torch.bfloat16
def pk(n, k): return bi.pack_linear_w8a8(torch.randn(n, k) * 0.05)
qkv, o, gu, dn = pk(960, H), pk(H, H), pk(2 * I, H), pk(H, I)
x = torch.randn(M, H).to(bf); xi = torch.randn(M, I).to(bf); g = torch.randn(M, I).to(bf)
w = torch.rand(H).to(bf)
S = 4096
kc = torch.randn(S, KVH, D).to(bf); vc = torch.randn(S, KVH, D).to(bf)
q = torch.randn(M, NH, D).to(bf)
args = bi.attention_args([M], [L], list(range((L + 15) // 16)), 16)
sm, qs, ql, kl, sl, ko = args
def T(name, f, n=300):
    for _ in range(20): f()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    print(f"{name:12s} {statistics.median(ts)*1e6:8.1f} us", flush=True)
T("norm", lambda: bi.rms_norm(x, w, 1e-5))
T("add_norm", lambda: bi.add_rms_norm(x, x, w, 1e-5))
T("qkv", lambda: bi.linear(x, qkv))
T("o", lambda: bi.linear(x, o))
T("gate_up", lambda: bi.linear(x, gu))
T("down", lambda: bi.linear(xi, dn))
T("silu", lambda: bi.silu_mul(g, xi))
T("attn", lambda: bi.paged_attention(q, kc, vc, qs, ql, kl, sl, ko, 0.125, True))
T("add", lambda: torch.add(x, x))
T("empty", lambda: bi.silu_mul(g[:0], xi[:0]))
