# python shrink_ab.py DTYPE CONCS [MS]: AR, adaptive DFlash as it is (DF), adaptive DFlash whose per-request
# acceptance estimates keep M pseudo-steps at the engine-wide rate that never decay (m M: shrinkage toward the
# traffic's rate), and fixed K = 1, side by side (side_by_side.py); every adaptive engine prices steps by DF's
# calibration
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-session32"))
torch.set_num_threads(2)
from side_by_side import line, run_level
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from dflash_trt.spec import policy as P
dt = sys.argv[1]; concs = [int(c) for c in sys.argv[2].split(",")]
ms = [float(m) for m in (sys.argv[3] if len(sys.argv) > 3 else "4,8").split(",")]
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)


class Shrunk(P.AcceptanceEstimate):
    def __init__(self, engine, m, **kw):
        super().__init__(prior_p=engine.p, **kw)
        self.engine, self.m = engine, m

    @property
    def p(self):
        total = self.succ + self.fail + self.m
        return (self.succ + self.m * self.engine.p) / total

    def lower(self, z):
        p, n = self.p, self.succ + self.fail + self.m
        return max(0.0, p - z * (p * (1.0 - p) / n) ** 0.5)


E = {"AR": LLM(speculative=False, **kw), "DF": LLM(draft=d, **kw)}
for m in ms:
    llm = LLM(draft=d, **kw)
    pol = llm.engine.policy
    lengths = pol.lengths
    lengths.new_estimate = (lambda L=lengths, m=m: Shrunk(L.engine_rate, m))
    pol.costs = lengths.costs = E["DF"].engine.policy.costs
    lengths._break_even.clear()
    E[f"m{m:g}"] = llm
E["k1"] = LLM(draft=d, draft_len_policy="fixed", max_draft_len=1, **kw)
for cc in concs:
    print(line(cc, run_level(E, cc)), flush=True)
