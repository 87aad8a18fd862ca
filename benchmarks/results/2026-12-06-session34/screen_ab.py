# python screen_ab.py DTYPE C[,C...] [ROUNDS]: the issue's sweep levels side by side on four engines: AR and adaptive
# DFlash with the greedy screen at any rows (fp32 heads, as now), and both with it cut at 8 rows (as before);
# aggregate tok/s and the ratios
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-session32"))
torch.set_num_threads(2)
from side_by_side import run_level
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]; levels = [int(c) for c in sys.argv[2].split(",")]; R = int(sys.argv[3]) if len(sys.argv) > 3 else 1
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
E = {"AR": LLM(speculative=False, **kw), "DF": LLM(draft=d, **kw),
     "AR8": LLM(speculative=False, **kw), "DF8": LLM(draft=d, **kw)}
for n in ("AR8", "DF8"):
    gh = E[n].engine.target.prepare_greedy_head()
    if gh is not None: gh.max_rows = 8
for r in range(R):
    for c in levels:
        f = run_level(E, c)
        print(f"c={c} " + " ".join(f"{n} {v[0]:.1f}" for n, v in f.items()) +
              f" | DF/AR {f['DF'][0] / f['AR'][0]:.3f} (tau {f['DF'][2]:.2f}), DF8/AR8 {f['DF8'][0] / f['AR8'][0]:.3f} "
              f"(tau {f['DF8'][2]:.2f}), AR/AR8 {f['AR'][0] / f['AR8'][0]:.3f}, DF/DF8 {f['DF'][0] / f['DF8'][0]:.3f}",
              flush=True)
