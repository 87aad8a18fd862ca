# python arm_ab.py DTYPE CONCS [REPS]: adaptive DFlash engines calibrated as at 1c4eb28 (calibrate_old.py, the
# greedy head screen arming part-way through the rounds) and as now (armed first), beside AR and fixed K = 1,
# side by side (side_by_side.py); REPS fresh pairs of adaptive engines (each its own calibration), their curves
# relative to T(4)
import os, sys, torch
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here); sys.path.insert(0, os.path.join(here, "..", "2026-12-06-session32"))
torch.set_num_threads(2)
from side_by_side import line, run_level
from dflash_trt import LLM
from dflash_trt import engine as engine_mod
from dflash_trt.embedded import embedded_paths
import calibrate_old
dt = sys.argv[1]; concs = [int(c) for c in sys.argv[2].split(",")]; reps = int(sys.argv[3]) if len(sys.argv) > 3 else 1
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
new_measure = engine_mod.measure_step_costs
def rel(llm):
    c = llm.engine.policy.costs
    return " ".join(f"{int(x)}:{y / c.target(4):.3f}" for x, y in c.curve)
E = {"AR": LLM(speculative=False, **kw)}
for r in range(reps):
    engine_mod.measure_step_costs = calibrate_old.measure_step_costs
    E[f"old{r}"] = LLM(draft=d, **kw)
    engine_mod.measure_step_costs = new_measure
    E[f"new{r}"] = LLM(draft=d, **kw)
    print(f"old{r}: {rel(E[f'old{r}'])} | new{r}: {rel(E[f'new{r}'])}", flush=True)
E["k1"] = LLM(draft=d, draft_len_policy="fixed", max_draft_len=1, **kw)
for cc in concs:
    print(line(cc, run_level(E, cc)), flush=True)
