# python step_profile.py DTYPE C MODE [N]: torch.profiler over N steady steps of one engine at C requests (MODE ar |
# k1 (fixed K = 1) | adaptive): per step, the step's total and the Python time outside every op (the step's and
# the proposer's self time), then self time by op
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, C, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
N = int(sys.argv[4]) if len(sys.argv) > 4 else 20
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
if mode == "ar": llm = LLM(speculative=False, **kw)
elif mode == "k1": llm = LLM(draft=d, draft_len_policy="fixed", max_draft_len=1, **kw)
else: llm = LLM(draft=d, **kw)
e = llm.engine
from torch.profiler import profile, ProfilerActivity, record_function
if e.proposer is not None:
    op = e.proposer.propose
    def prop(*a, **k):
        with record_function("PROPOSE"):
            return op(*a, **k)
    e.proposer.propose = prop
lp = ClosedLoop(llm, (PROMPTS * C)[:max(C, 8)], C, 256)
for _ in range(8): lp.step()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for i in range(N):
        with record_function("STEP"):
            lp.step()
ka = {x.key: x for x in prof.key_averages()}
st = ka["STEP"]
print(f"{mode} c={C}: step {st.cpu_time_total / N / 1e3:.2f} ms, step self {st.self_cpu_time_total / N / 1e3:.2f} ms",
      (f"propose {ka['PROPOSE'].cpu_time_total / N / 1e3:.2f} ms, propose self "
       f"{ka['PROPOSE'].self_cpu_time_total / N / 1e3:.2f} ms" if "PROPOSE" in ka else ""))
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=50))
