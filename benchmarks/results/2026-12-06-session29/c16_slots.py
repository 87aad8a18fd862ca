# python c16_slots.py: 64 requests at c=16 (bf16), DFlash with a fixed K = 1: what the scheduler ran per step (slots busy, prefills, drafting, decoding without a draft)
import os, sys, torch, collections
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from batching import ClosedLoop, PROMPTS
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
t, d = embedded_paths()
C = 16
llm = LLM(draft=d, speculative=True, draft_len_policy="fixed", max_draft_len=1, target=t, max_batch_size=C, dtype="bfloat16")
e = llm.engine
stats = collections.Counter()
orig = e.scheduler.schedule
def sched():
    w = orig()
    live = len(e.scheduler.running)
    stats["steps"] += 1
    stats["live"] += live
    stats["scheduled"] += len(w)
    stats["prefill"] += sum(1 for x in w if x.is_prefill)
    stats["drafting"] += sum(1 for x in w if x.draft_len > 0)
    stats["decode_nodraft"] += sum(1 for x in w if not x.is_prefill and x.draft_len == 0)
    return w
e.scheduler.schedule = sched
lp = ClosedLoop(llm, (PROMPTS * 4)[:64], C, 64)
while lp.busy:
    lp.step()
print(dict(stats), "preemptions", e.scheduler.num_preemptions, "tokens", sum(s.num_output for s in lp.done))
