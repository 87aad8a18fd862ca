# python calib_ab.py DTYPE [N]: the calibration of 1c4eb28 (calibrate_old.py: each point in units of its round's
# fixed cost) and paired (each point over the one-row passes right before and after it; not kept: make it with
# `patch -o calibrate_paired.py calibrate_old.py paired_ref.patch`), alternated N times each on one adaptive
# engine: each run's T(rows)/T(4) and D(4)/T(4), the spread (max / min) of each over the runs, seconds
import os, sys, time, torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
import calibrate_paired as new
import calibrate_old as old
t, d = embedded_paths()
n = int(sys.argv[2]) if len(sys.argv) > 2 else 4
e = LLM(target=t, draft=d, max_batch_size=32, dtype=sys.argv[1]).engine
conf = e.policy.min_confidence > 0
res = {"old": [], "new": []}
for i in range(n):
    for tag, mod in (("old", old), ("new", new)):
        t0 = time.perf_counter()
        m = mod.measure_step_costs(e.runner, e.proposer, e.blocks, token_id=0, confidence=conf)
        sec = time.perf_counter() - t0
        c = dict(m["curve"])
        fig = {int(x): y / c[4.0] for x, y in m["curve"]}
        fig["D4"] = dict(m["draft_curve"])[4.0] / c[4.0]
        fig["D16"] = dict(m["draft_curve"])[16.0] / c[4.0]
        res[tag].append(fig)
        print(f"{tag} {i} ({sec:.2f} s): " + " ".join(f"{k}:{v:.3f}" for k, v in fig.items()), flush=True)
for tag, rs in res.items():
    print(f"{tag} spread (max/min over {n}): " + " ".join(f"{k}:{max(r[k] for r in rs) / min(r[k] for r in rs):.3f}"
                                                         for k in rs[0]), flush=True)
