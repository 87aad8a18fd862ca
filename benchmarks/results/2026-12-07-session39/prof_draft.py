# python prof_draft.py WEIGHTS: torch.profiler over one DFlash decode, ops by input shape
import torch, sys
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
t, d = embedded_paths()
llm = LLM(target=t, dtype="bfloat16", weights=sys.argv[1], draft=d, draft_len_policy="fixed", max_draft_len=7)
p = ["Write a Python function that returns the n-th Fibonacci number."]
sp = SamplingParams(max_tokens=128, ignore_eos=True)
llm.generate(p, sp, chat=True)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    llm.generate(p, sp, chat=True)
print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=40, max_shapes_column_width=70))
