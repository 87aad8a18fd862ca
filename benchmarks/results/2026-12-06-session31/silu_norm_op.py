# python silu_norm_op.py: bi.silu_mul and bi.rms_norm on bf16 rows, one thread, us per call and ns per element
import time, torch
from dflash_trt.plugins import invariant as bi
torch.set_num_threads(1)
def t(f, n=200):
    f(); t0=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t0)/n*1e6
for rows in (1, 240):
    g = torch.randn(rows, 1536).bfloat16(); u = torch.randn(rows, 1536).bfloat16()
    x = torch.randn(rows, 576).bfloat16(); w = torch.randn(576).bfloat16()
    a = t(lambda: bi.silu_mul(g, u)); b = t(lambda: bi.rms_norm(x, w, 1e-5))
    c = t(lambda: torch.empty(0))
    print(rows, f"silu {a:.1f} us ({a*1e3/(rows*1536):.2f} ns/elt)  norm {b:.1f} us ({b*1e3/(rows*576):.2f} ns/elt) empty {c:.1f}")
