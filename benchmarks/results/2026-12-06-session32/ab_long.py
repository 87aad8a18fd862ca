# python ab_long.py DTYPE C NREQ MAXTOK ENGINES: engines side by side; steady-state figures too (tokens/s over steps
# where every slot decodes)
import os
import sys, time, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, cc, nreq, mt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
names = sys.argv[5].split(",")
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
mk = {"AR": lambda: LLM(speculative=False, **kw), "AR2": lambda: LLM(speculative=False, **kw),
      "ad": lambda: LLM(draft=d, **kw),
      "k1": lambda: LLM(draft=d, draft_len_policy="fixed", max_draft_len=1, **kw),
      "k2": lambda: LLM(draft=d, draft_len_policy="fixed", max_draft_len=2, **kw)}
E = {n: mk[n]() for n in names}
class L2(ClosedLoop):
    def __init__(s, *a, **k):
        super().__init__(*a, **k); s.ss_t = 0.0; s.ss_tok = 0
    def step(s):
        full = len(s.live) == s.c and not s.todo and all(x.num_output > 0 for x in s.live) or \
               (len(s.live) == s.c and all(x.num_output > 0 for x in s.live))
        before = sum(x.num_output for x in s.live)
        c0 = s.clock
        live = list(s.live)
        super().step()
        if full and all(x in live for x in s.live) and len(live) == s.c:
            s.ss_t += s.clock - c0; s.ss_tok += sum(x.num_output for x in live) - before
ps = (PROMPTS * cc)[:nreq]
Ls = {n: L2(l, ps, cc, mt) for n, l in E.items()}
while any(lp.busy for lp in Ls.values()):
    for lp in Ls.values():
        if lp.busy: lp.step()
f = {n: lp.figures() for n, lp in Ls.items()}
ss = {n: lp.ss_tok / lp.ss_t for n, lp in Ls.items()}
print(dt, cc, nreq, mt, " ".join(f"{n} {f[n][0]:.1f} ({f[n][0]/f['AR'][0]:.3f}x, ss {ss[n]/ss['AR']:.3f}x, tau {f[n][2]:.2f})" for n in E), flush=True)
