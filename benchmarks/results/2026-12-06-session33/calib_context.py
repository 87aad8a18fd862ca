# python calib_context.py DTYPE: the calibration's target curve measured with its scratch requests at 48, 100 and
# 200 cached positions, alternated (3 rounds), on one adaptive engine: how much a verify row's attention moves it
import sys, torch
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from dflash_trt.spec import calibrate as cal
t, d = embedded_paths()
llm = LLM(target=t, draft=d, max_batch_size=32, dtype=sys.argv[1])
e = llm.engine
for rnd in range(3):
    for ctx in (48, 100, 200):
        cal.CONTEXT = ctx
        m = cal.measure_step_costs(e.runner, e.proposer, e.blocks, token_id=0)
        c = dict(m["curve"])
        print(f"round {rnd} context {ctx}: T(rows)/T(4): "
              + " ".join(f"{int(x)}:{y / c[4.0]:.3f}" for x, y in m["curve"]),
              "| D(4)/T(4)", f"{dict(m['draft_curve'])[4.0] / c[4.0]:.3f}", flush=True)
