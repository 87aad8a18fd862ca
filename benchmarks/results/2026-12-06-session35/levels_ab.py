# python levels_ab.py DTYPE LEVELS: the sweep levels in the given order (e.g. 1,4,16,32,16,32) on one set of
# engines, side by side: AR, a second AR, adaptive DFlash, and a DFlash engine that never drafts (K=0: the cost
# of capturing features and keeping the drafter's context); aggregate tok/s ratios to AR and DFlash's tau
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
for c in levels:
    f = run_level(E, c)
    print(f"c={c:2d} " + " ".join(f"{n} {f[n][0] / f['AR'][0]:.3f}" for n in E if n != "AR") +
          f" (AR {f['AR'][0]:.1f} tok/s, DF tau {f['DF'][2]:.2f})", flush=True)
