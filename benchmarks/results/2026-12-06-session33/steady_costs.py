# python steady_costs.py DTYPE CONCS: AR, adaptive DFlash priced by its own start-up calibration (DF), adaptive
# DFlash priced by a curve measured in steady state (DFs: calib_ab_fp32.txt's "old" medians, relative to T(4)),
# and fixed K = 1, side by side (side_by_side.py)
import os, sys, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-session32"))
torch.set_num_threads(2)
from side_by_side import line, run_level
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]; concs = [int(c) for c in sys.argv[2].split(",")]
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
steady = {"row": 0.09, "draft": 0.13, "draft_row": 0.01, "draft_rows": 4,
          "curve": [(1, 0.85), (4, 1.0), (8, 1.32), (12, 1.70), (16, 2.09), (32, 2.86)],
          "draft_curve": [(1, 0.127), (4, 0.155), (16, 0.37)]}
E = {"AR": LLM(speculative=False, **kw), "DF": LLM(draft=d, **kw), "DFs": LLM(draft=d, **kw),
     "k1": LLM(draft=d, draft_len_policy="fixed", max_draft_len=1, **kw)}
from dflash_trt.spec.policy import StepCosts
pol = E["DFs"].engine.policy  # its own start-up figures replaced by the steady ones
pol.costs = pol.lengths.costs = StepCosts(**steady)
pol.lengths._break_even.clear()
c = E["DF"].engine.policy.costs
print("DF start-up curve relative to T(4):", [(x, round(y / c.target(4), 3)) for x, y in c.curve],
      [(x, round(y / c.target(4), 3)) for x, y in c.draft_curve], flush=True)
for cc in concs:
    print(line(cc, run_level(E, cc)), flush=True)
