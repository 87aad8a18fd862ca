# python calib_raw.py: the start-up calibration's raw timings (ms) of each round, then the bf16 engine's StepCosts
import sys, torch
torch.set_num_threads(2)
import dflash_trt.spec.calibrate as cal
orig = cal._costs
def c(t, runs, pc):
    print({k: round(v * 1e3, 2) for k, v in t.items()}, flush=True); return orig(t, runs, pc)
cal._costs = c
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
t, d = embedded_paths()
llm = LLM(target=t, draft=d, max_batch_size=32, dtype="bfloat16")
print(llm.engine.policy.costs)
