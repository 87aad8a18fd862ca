# python levels_probes.py DTYPE LEVELS: session 34's levels_ab.py (AR, AR2, adaptive DFlash, never-drafting DFlash on
# one set of engines) with adaptive DFlash's drafter passes per level: (requests in the pass, shadows among them)
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-session32"))
torch.set_num_threads(2)
from side_by_side import run_level
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]; levels = [int(c) for c in sys.argv[2].split(",")]
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
E = {"AR": LLM(speculative=False, **kw), "AR2": LLM(speculative=False, **kw), "DF": LLM(draft=d, **kw),
     "K=0": LLM(draft=d, draft_len_schedule={1: 0}, **kw)}
e = E["DF"].engine; pol = e.policy; L = pol.lengths; passes = []
fp = e.proposer.propose
def prop(work, *a, **k):
    passes.append((len(work), sum(1 for w in work if pol.shadow_len(w.seq))))
    return fp(work, *a, **k)
e.proposer.propose = prop
print("floor(7, 16)", round(L.floor(7, 16), 3), "costs", pol.costs.curve, pol.costs.draft_curve, flush=True)
for c in levels:
    passes.clear()
    f = run_level(E, c)
    print(f"c={c:2d} " + " ".join(f"{n} {f[n][0] / f['AR'][0]:.3f}" for n in E if n != "AR") +
          f" (AR {f['AR'][0]:.1f} tok/s, DF tau {f['DF'][2]:.2f}) engine rate {L.engine_rate.p:.3f} upper "
          f"{L.engine_rate.upper(1.0):.3f}; passes {passes if c >= 16 else len(passes)}", flush=True)
