import sys, time, statistics, torch
torch.set_num_threads(2)
import os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from stack_calls import capture
from torch.profiler import profile, ProfilerActivity
dt = sys.argv[1]; wts = sys.argv[2] if len(sys.argv) > 2 else "auto"
orig, cap, _ = capture(dt, wts, ar_tokens=0)
print({k: len(v) for k, v in cap.items()})
src = torch.ones(64 << 20)
for n in (1, 8):
    calls = cap[n][-20:]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for a in calls:
            src.sum()
            orig(*a)
    tot = {}
    for e in prof.key_averages():
        if e.key.startswith("dflash_trt::") or e.key in ("aten::sum",):
            tot[e.key] = e.self_cpu_time_total / len(calls) / 1e3
    print(n, "rows:", " ".join(f"{k.replace('dflash_trt::','')} {v:.2f}" for k, v in sorted(tot.items(), key=lambda kv: -kv[1]) if k != "aten::sum"))
