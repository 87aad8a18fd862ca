# python k1_profile.py DTYPE C MODE: torch.profiler over the steady steps of one engine at C requests
# (MODE ar | k1: fixed K = 1), 32 requests of 64 tokens, 2 threads: self time by op
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, C, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
llm = LLM(speculative=False, **kw) if mode == "ar" else LLM(draft=d, draft_len_policy="fixed", max_draft_len=1, **kw)
lp = ClosedLoop(llm, (PROMPTS * C)[:32], C, 64)
for _ in range(8): lp.step()
from torch.profiler import profile, ProfilerActivity, record_function
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for i in range(20):
        with record_function("STEP"):
            lp.step()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
