# python trust_ab.py DTYPE CONCS [ZS]: AR, adaptive DFlash as it is, adaptive DFlash whose batch plan prices each
# request at least Z standard errors under its estimate (z = max(Z, the batch's own share)), and fixed K = 1,
# side by side (side_by_side.py); every adaptive engine prices steps by DF's calibration
import os, sys, types, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-session32"))
torch.set_num_threads(2)
from side_by_side import line, run_level
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from dflash_trt.spec import policy as P
dt = sys.argv[1]; concs = [int(c) for c in sys.argv[2].split(",")]
zs = [float(z) for z in (sys.argv[3] if len(sys.argv) > 3 else "0.5,1").split(",")]
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
def plan_with_floor(zmin):
    def plan(self, decoding, k, max_seq_len):
        if not self.adaptive or len(decoding) < 2:
            return
        z = max(zmin, min(1.0, (len(decoding) - 1) / (P.TRUST_BATCH - 1)))
        able, others = [], 0
        for seq in decoding:
            cap = self._cap(seq, k, max_seq_len) if seq.spec_enabled and seq.acceptance is not None else 0
            if cap > 0:
                able.append((seq.acceptance.lower(z), cap))
            else:
                others += 1
        if able:
            self.planned = P.batch_draft_len([a[0] for a in able], [a[1] for a in able], others, k, self.costs,
                                             P.margin_for(len(decoding)))
    return plan
E = {"AR": LLM(speculative=False, **kw), "DF": LLM(draft=d, **kw)}
for z in zs:
    llm = LLM(draft=d, **kw)
    pol = llm.engine.policy
    pol.plan = types.MethodType(plan_with_floor(z), pol)
    pol.costs = pol.lengths.costs = E["DF"].engine.policy.costs  # one calibration for every adaptive engine
    pol.lengths._break_even.clear()
    E[f"z{z:g}"] = llm
E["k1"] = LLM(draft=d, draft_len_policy="fixed", max_draft_len=1, **kw)
for cc in concs:
    print(line(cc, run_level(E, cc)), flush=True)
