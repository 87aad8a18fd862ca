# python propose_ops.py DTYPE C [N] [k1]: what the drafter's propose spends its time on, adaptive DFlash (k1: fixed
# K = 1) at C requests:
# self time by op under PROPOSE (ms per propose), and the Python left over (PROPOSE's own self time)
import os, sys, collections, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from torch.profiler import profile, ProfilerActivity, record_function
dt, C = sys.argv[1], int(sys.argv[2]); N = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3].isdigit() else 40
t, d = embedded_paths()
fixed = dict(draft_len_policy="fixed", max_draft_len=1) if sys.argv[-1] == "k1" else {}
llm = LLM(draft=d, target=t, max_batch_size=32, dtype=dt, **fixed)
e = llm.engine
op = e.proposer.propose
def prop(*a, **k):
    with record_function("PROPOSE"):
        return op(*a, **k)
e.proposer.propose = prop
lp = ClosedLoop(llm, (PROMPTS * C)[:max(C, 8)], C, 128)
for _ in range(10): lp.step()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for i in range(N): lp.step()
tot = collections.Counter(); n = 0; own = 0.0; whole = 0.0
def walk(ev):
    for ch in ev.cpu_children:
        tot[ch.name] += ch.self_cpu_time_total
        walk(ch)
for ev in prof.events():
    if ev.name == "PROPOSE":
        n += 1; own += ev.self_cpu_time_total; whole += ev.cpu_time_total
        walk(ev)
print(f"{n} proposes: {whole / n / 1e3:.3f} ms each, Python (own) {own / n / 1e3:.3f} ms")
for k, v in tot.most_common(22): print(f"  {v / n / 1e3:.3f} ms  {k}")
