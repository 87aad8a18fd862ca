# python drift_trace.py DTYPE LEVELS: adaptive DFlash alone through the sweep's levels, priced by the costs a 2-core
# Xeon with AMX measured at start (tests/test_draft_policy.py BF16_C16: there drafting can pay at 16 requests, so
# the engine probes; this machine's own costs do not draft at 16). Per level: tok/s, tau, the iterations with verified
# drafts, the settled probes (drafted, accepted) and which running request each engine probe fell on (its
# position among the decoding requests), and the engine-wide rate.
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from test_draft_policy import BF16_C16
dt = sys.argv[1]; levels = [int(c) for c in sys.argv[2].split(",")]
t, d = embedded_paths()
llm = LLM(draft=d, target=t, max_batch_size=32, dtype=dt)
e = llm.engine; pol = e.policy
pol.costs = pol.lengths.costs = BF16_C16
pol.lengths._break_even.clear()
drafted, settled, where = [], [], []
op = e.proposer.propose
def prop(work, *a, **k):
    it = pol.lengths.iteration
    dec = [s for s in e.scheduler.running if not s.in_prefill]
    sh = [w for w in work if w.seq.acceptance is not None and w.seq.acceptance.shadow_at == it]
    if any(w not in sh for w in work):
        drafted.append(it)
    if len(sh) == 1 and len(dec) > 1:
        where.append(dec.index(sh[0].seq))
    return op(work, *a, **k)
e.proposer.propose = prop
ob = pol.observe
def observe(seq, n, a):
    if seq.acceptance is not None and seq.acceptance.shadow is None and seq.acceptance.probing:
        settled.append((n, a))
    return ob(seq, n, a)
pol.observe = observe
print(f"floor(7, 16) {pol.lengths.floor(7, 16):.3f}", flush=True)
for c in levels:
    drafted.clear(); settled.clear(); where.clear()
    lp = ClosedLoop(llm, (PROMPTS * c)[:max(c, 32)], c, 64)
    while lp.busy: lp.step()
    f = lp.figures()
    print(f"c={c:2d} tok/s {f[0]:6.1f} tau {f[2]:.2f} verified-draft iterations {len(drafted):3d} settled {settled[:8]} "
          f"one-request probes at {where[:6]} engine rate {pol.lengths.engine_rate.p:.3f} "
          f"(upper {pol.lengths.engine_rate.upper(1.0):.3f})", flush=True)
