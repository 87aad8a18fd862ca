# python wctx_ops.py DTYPE ROWS: the drafter's context write of ROWS committed rows by op (torch.profiler self time,
# ms per call), and its wall time per call
import os, sys, time, collections, torch
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from torch.profiler import profile, ProfilerActivity
dt, R = sys.argv[1], int(sys.argv[2])
t, d = embedded_paths()
e = LLM(target=t, draft=d, max_batch_size=32, dtype=dt).engine
p = e.proposer; dr = p.drafter
feats = torch.randn(R, len(p.feature_layers) * dr.cfg.hidden_size).to(torch.float32 if dt == "float32" else torch.bfloat16)
pos = torch.arange(100, 100 + R); slots = torch.arange(100, 100 + R)
def one(): dr.write_context(feats, pos, slots, p.caches)
for _ in range(20): one()
t0 = time.perf_counter()
for _ in range(200): one()
print(f"write_context of {R} rows: {(time.perf_counter() - t0) / 200 * 1e3:.3f} ms per call")
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(100): one()
tot = collections.Counter()
for ev in prof.key_averages(): tot[ev.key] = ev.self_cpu_time_total
for k, v in tot.most_common(14): print(f"  {v / 100 / 1e3:.3f} ms  {k}")
print("feature dtype", feats.dtype, "fc weight", dr.fc.weight.dtype)
