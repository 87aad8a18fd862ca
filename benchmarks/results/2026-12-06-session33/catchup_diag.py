# python catchup_diag.py DTYPE CONCS: AR, adaptive DFlash and a never-drafting DFlash side by side (side_by_side.py);
# the adaptive engine's drafter context writes (calls, rows, seconds) and its drafting iterations' time
import os, sys, time, collections, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-06-session32"))
torch.set_num_threads(2)
from side_by_side import line, run_level
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]; concs = [int(c) for c in sys.argv[2].split(",")]
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
E = {"AR": LLM(speculative=False, **kw), "DF": LLM(draft=d, **kw), "K0": LLM(draft=d, draft_len_schedule={1: 0}, **kw)}
eng = E["DF"].engine
prop = eng.proposer
stats = collections.defaultdict(float)
ow, op = prop.drafter.write_context, prop.propose
def wc(feats, *a, **k):
    t0 = time.perf_counter(); r = ow(feats, *a, **k); stats["wc_s"] += time.perf_counter() - t0
    stats["wc_calls"] += 1; stats["wc_rows"] += feats.shape[0]; stats["wc_max"] = max(stats["wc_max"], feats.shape[0])
    return r
def pp(work, *a, **k):
    stats["drafting_iters"] += any(w.draft_len > 0 for w in work)
    return op(work, *a, **k)
prop.drafter.write_context, prop.propose = wc, pp
ostep = eng.step
def step():
    n = stats["drafting_iters"]; t0 = time.perf_counter(); r = ostep(); dt_ = time.perf_counter() - t0
    key = "draft_iter_s" if stats["drafting_iters"] > n else "plain_iter_s"
    stats[key] += dt_; stats[key.replace("_s", "_n")] += 1
    return r
eng.step = step
for cc in concs:
    stats.clear()
    print(line(cc, run_level(E, cc)), flush=True)
    print("  ", {k: round(v, 4) for k, v in stats.items()}, flush=True)
