import sys, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.spec.calibrate import measure_step_costs
t, d = embedded_paths()
llm = LLM(target=t, draft=d, max_batch_size=32, dtype=sys.argv[1])
e = llm.engine
c0 = e.policy.costs
print("start      ", " ".join(f"{x:g}:{y / c0.curve[0][1]:.3f}" for x, y in c0.curve))
for i in range(2):
    c = measure_step_costs(e.runner, e.proposer, e.blocks, 0, k=3)["curve"]
    print("again, idle", " ".join(f"{x:g}:{y / c[0][1]:.3f}" for x, y in c), flush=True)
