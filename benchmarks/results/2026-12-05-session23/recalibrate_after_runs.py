import sys, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.spec.calibrate import measure_step_costs
t, d = embedded_paths()
llm = LLM(target=t, draft=d, max_batch_size=32, dtype=sys.argv[1])
e = llm.engine
def show(tag, c):
    cur = c["curve"]; base = cur[0][1]
    print(tag, " ".join(f"{x:g}:{y / base:.3f}" for x, y in cur), flush=True)
c0 = e.policy.costs
print("start", " ".join(f"{x:g}:{y / c0.curve[0][1]:.3f}" for x, y in c0.curve))
for i in range(3):
    llm.generate(["Write a Python function that returns the n-th Fibonacci number."] * 4, SamplingParams(max_tokens=64, ignore_eos=True), chat=True)
    show(f"after {i + 1} runs", measure_step_costs(e.runner, e.proposer, e.blocks, 0, k=3))
