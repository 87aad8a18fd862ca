# python calib_screen.py DTYPE [N]: the calibration with the target's greedy head screen armed (as it runs once
# an engine has served 64 rows) and not armed (as at engine start, when it is measured), alternated N times on
# one adaptive engine: T(rows)/T(4) and D(4)/T(4) of each, and the screen's state at engine start
import sys, torch
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from dflash_trt.spec import calibrate as cal
t, d = embedded_paths()
e = LLM(target=t, draft=d, max_batch_size=32, dtype=sys.argv[1]).engine
gh = e.target.greedy_screen
print("screen armed after the start-up calibration:", gh.armed, "rows seen", gh.rows_seen, flush=True)
c = dict(e.policy.costs.curve)
print("start-up: " + " ".join(f"{int(x)}:{y / c[4.0]:.3f}" for x, y in e.policy.costs.curve), flush=True)
armed_state = (gh.out_idx, gh.wo) if gh.armed else None
for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
    for tag in ("armed", "unarmed"):
        if tag == "unarmed":
            gh.armed, gh.rows_seen = False, 0
            gh.seen.zero_()
        else:
            if not gh.armed:  # serve rows until it arms
                from dflash_trt import SamplingParams
                while not gh.armed:
                    s = e.add_request(list(range(100, 140)), SamplingParams(max_tokens=16, ignore_eos=True))
                    while not s.is_finished: e.step()
                    e.release(s)
        m = cal.measure_step_costs(e.runner, e.proposer, e.blocks, token_id=0, confidence=e.policy.min_confidence > 0)
        c = dict(m["curve"])
        print(f"{tag} {i}: " + " ".join(f"{int(x)}:{y / c[4.0]:.3f}" for x, y in m["curve"]),
              "| D4", f"{dict(m['draft_curve'])[4.0] / c[4.0]:.3f}", "| armed after:", gh.armed, flush=True)
