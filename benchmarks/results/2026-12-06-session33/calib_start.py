# python calib_start.py DTYPE [N]: the adaptive engine's calibration at start against the same measurement repeated
# right after, N times: T(rows)/T(4) and D(4)/T(4) of each
import sys, torch
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from dflash_trt.spec import calibrate as cal
t, d = embedded_paths()
def show(tag, curve, dcurve):
    c = dict(curve)
    print(f"{tag}: T(rows)/T(4): " + " ".join(f"{int(x)}:{y / c[4.0]:.3f}" for x, y in curve),
          "| D(4)/T(4)", f"{dict(dcurve)[4.0] / c[4.0]:.3f}", flush=True)
for start in range(2):
    llm = LLM(target=t, draft=d, max_batch_size=32, dtype=sys.argv[1])
    e = llm.engine
    show(f"engine {start} at start", e.policy.costs.curve, e.policy.costs.draft_curve)
    for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2):
        m = cal.measure_step_costs(e.runner, e.proposer, e.blocks, token_id=0, confidence=e.policy.min_confidence > 0)
        show(f"engine {start} again {i}", m["curve"], m["draft_curve"])
    del llm, e
