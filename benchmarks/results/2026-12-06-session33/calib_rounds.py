# python calib_rounds.py DTYPE [TRIES] [REPS]: the calibration's per-round figures (each point over its round's
# 16-row pass) for TRIES rounds, REPS calibrations in a row on one engine: how far one round's ratio strays
import sys, statistics, torch
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
import dflash_trt.spec.calibrate as cal
t, d = embedded_paths()
tries = int(sys.argv[2]) if len(sys.argv) > 2 else 5
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
e = LLM(target=t, draft=d, max_batch_size=32, dtype=sys.argv[1], draft_len_policy="fixed").engine
rounds = []
orig = cal._timed_rounds
def keep(*a, **k):
    r = orig(*a, **k); rounds.extend(r); return r
cal._timed_rounds = keep
for rep in range(reps):
    rounds.clear()
    cal.measure_step_costs(e.runner, e.proposer, e.blocks, token_id=0, tries=tries)
    for name in ("one", "block", "long", "few", "verify", "d_mid", "d_wide"):
        r = [t[name] / t["wide"] for t in rounds]
        print(f"rep {rep} {name:7s}/wide: " + " ".join(f"{x:.3f}" for x in r),
              f"| median {statistics.median(r):.3f}", flush=True)
