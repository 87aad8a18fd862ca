import sys, time, statistics, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.plugins import layer
from torch.profiler import profile, ProfilerActivity
dt = sys.argv[1]; wts = sys.argv[2] if len(sys.argv) > 2 else "auto"
t, d = embedded_paths()
llm = LLM(target=t, dtype=dt, weights=wts, draft=d, draft_len_policy="fixed", max_draft_len=7)
layer.load()
orig = layer._state["stack"]
cap = {}
def wrap(*a):
    if len(a[4]) == 30: cap.setdefault(a[1].shape[0], []).append(a)
    return orig(*a)
layer._state["stack"] = wrap
llm.generate(["Write a Python function that returns the n-th Fibonacci number."], SamplingParams(max_tokens=200, ignore_eos=True), chat=True)
layer._state["stack"] = orig
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
