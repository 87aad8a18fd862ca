# python draft_profile.py DTYPE C: the drafter's part of fixed-K=1 steps at C requests (propose, observe), by op
import os, sys, time, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, C = sys.argv[1], int(sys.argv[2])
t, d = embedded_paths()
llm = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=1, max_batch_size=32, dtype=dt)
e = llm.engine
from torch.profiler import profile, ProfilerActivity, record_function
op = e.proposer.propose
def prop(*a, **k):
    with record_function("PROPOSE"):
        return op(*a, **k)
e.proposer.propose = prop
lp = ClosedLoop(llm, (PROMPTS * C)[:32], C, 64)
for _ in range(8): lp.step()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for i in range(20):
        with record_function("STEP"):
            lp.step()
ev = [x for x in prof.key_averages() if x.key in ("STEP", "PROPOSE")]
for x in ev: print(x.key, f"{x.cpu_time_total / x.count / 1e3:.2f} ms avg over {x.count}")
print(prof.key_averages(group_by_stack_n=0).table(sort_by="self_cpu_time_total", row_limit=14,
                                                  max_name_column_width=50))
