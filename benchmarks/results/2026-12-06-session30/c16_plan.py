# python c16_plan.py: adaptive bf16 DFlash alone in batching.py's closed loop at c = 16 (fresh engine): the K each planned
# iteration chose, by batch size, and the iterations where no K could pay
import sys, collections, torch
import os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from batching import ClosedLoop, PROMPTS
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
t, d = embedded_paths()
C = 16
llm = LLM(target=t, draft=d, speculative=True, max_batch_size=32, dtype="bfloat16")
pol = llm.engine.policy
log = collections.Counter()
orig = pol.plan
def plan(decoding, k, msl):
    orig(decoding, k, msl)
    ps = [s.acceptance.p for s in decoding if s.acceptance is not None]
    log[(len(decoding), pol.planned)] += 1
pol.plan = plan
ob = pol.begin_iteration
zero = collections.Counter()
def bi(n):
    k = ob(n)
    if not k: zero[n] += 1
    return k
pol.begin_iteration = bi
lp = ClosedLoop(llm, (PROMPTS * C)[:32], C, 64)
while lp.busy: lp.step()
print("tok/s, user, tau", lp.figures())
print("plan (batch, K): count", sorted(log.items(), key=str))
print("no K at all (batch: count)", sorted(zero.items()))
