# python shadow_trace.py DTYPE LEVELS: adaptive DFlash alone through the sweep's levels: per level, the iterations
# that drafted (iteration, decoding batch, verified drafts per request, shadow probes' K) and the shadow probes'
# settled (drafted, accepted)
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]; levels = [int(c) for c in sys.argv[2].split(",")]
t, d = embedded_paths()
llm = LLM(draft=d, target=t, max_batch_size=32, dtype=dt)
e = llm.engine; pol = e.policy
log, settled = [], []
op = e.proposer.propose
def prop(work, *a, **k):
    dec = [s for s in e.scheduler.running if not s.in_prefill]
    shadows = {w.seq.seq_id for w in work if w.seq.acceptance and w.seq.acceptance.shadow_at == pol.lengths.iteration}
    log.append((pol.lengths.iteration, len(dec), [w.draft_len for w in work if w.seq.seq_id not in shadows],
                [w.draft_len for w in work if w.seq.seq_id in shadows]))
    return op(work, *a, **k)
e.proposer.propose = prop
ob = pol.observe
def observe(seq, drafted, accepted):
    if seq.acceptance is not None and seq.acceptance.shadow is None and seq.acceptance.probing:
        settled.append((drafted, accepted))
    return ob(seq, drafted, accepted)
pol.observe = observe
for c in levels:
    log.clear(); settled.clear()
    lp = ClosedLoop(llm, (PROMPTS * c)[:max(c, 32)], c, 64)
    while lp.busy: lp.step()
    print(f"c={c}: tok/s {lp.figures()[0]:.1f} tau {lp.figures()[2]:.2f}, {len(log)} drafting iterations, "
          f"{sum(1 for x in log if x[3])} with shadow probes; (iteration, batch, verified, shadow):",
          log[:12] if c >= 16 else "", "settled:", settled[:20], f"engine rate {pol.lengths.engine_rate.p:.3f} upper "
          f"{pol.lengths.engine_rate.upper(1.0):.3f} floor(7, 16) {pol.lengths.floor(7, 16):.3f}", flush=True)
