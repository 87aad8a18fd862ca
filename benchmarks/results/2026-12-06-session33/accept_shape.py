# python accept_shape.py DTYPE CONCS [K]: per-position conditional acceptance of the embedded drafter (fixed K, the
# batching loop's prompts): of the steps whose draft reached position j (j-1 accepted, K >= j), the share that
# accepted it; and the one geometric p the policy's estimate (successes / (successes + failures)) gives
import os, sys, collections, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]; concs = [int(c) for c in sys.argv[2].split(",")]; K = int(sys.argv[3]) if len(sys.argv) > 3 else 7
t, d = embedded_paths()
llm = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=K, max_batch_size=32, dtype=dt)
pol = llm.engine.policy
log = []
ob = pol.observe
def observe(seq, drafted, accepted):
    log.append((drafted, accepted)); return ob(seq, drafted, accepted)
pol.observe = observe
for c in concs:
    log.clear()
    lp = ClosedLoop(llm, (PROMPTS * c)[:32], c, 64)
    while lp.busy: lp.step()
    reach, acc = collections.Counter(), collections.Counter()
    for k, a in log:
        for j in range(1, k + 1):
            if a >= j - 1: reach[j] += 1
            if a >= j: acc[j] += 1
    succ = sum(a for k, a in log); fail = sum(1 for k, a in log if a < k)
    print(f"c={c} K={K} steps {len(log)} tau {1 + succ / max(len(log), 1):.2f} geometric p {succ / (succ + fail):.3f}; "
          "conditional by position: " + " ".join(f"{j}:{acc[j] / reach[j]:.2f}({reach[j]})" for j in sorted(reach)),
          flush=True)
