# py-spy record -r 400 -f raw -o sd.raw -- python gen_sd.py WEIGHTS ROUNDS: DFlash decodes to profile
import sys, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
t, d = embedded_paths()
llm = LLM(target=t, dtype="bfloat16", weights=sys.argv[1], draft=d, draft_len_policy="fixed", max_draft_len=7)
p = ["Write a Python function that returns the n-th Fibonacci number.", "Explain how a hash map handles collisions."]
sp = SamplingParams(max_tokens=256, ignore_eos=True)
for _ in range(int(sys.argv[2])):
    for q in p: llm.generate([q], sp, chat=True)
