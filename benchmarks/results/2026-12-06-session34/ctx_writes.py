# python ctx_writes.py DTYPE LEVELS: adaptive DFlash alone through the sweep's levels (e.g. 1,4,16): per level, the
# engine's step time, and the drafter context writes inside it by caller (propose, observe, share, release) with
# rows and ms
import os, sys, time, collections, inspect, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]; levels = [int(c) for c in sys.argv[2].split(",")]
t, d = embedded_paths()
llm = LLM(draft=d, target=t, max_batch_size=32, dtype=dt)
p = llm.engine.proposer
acc = collections.defaultdict(lambda: [0, 0, 0.0]); calls = []
f = p.drafter.write_context
def wc(feats, *a, **k):
    caller = [fr.function for fr in inspect.stack()[1:6] if fr.function in ("propose", "observe", "share", "release")]
    t0 = time.perf_counter(); r = f(feats, *a, **k)
    a_ = acc[caller[0] if caller else "?"]; a_[0] += 1; a_[1] += feats.shape[0]; a_[2] += time.perf_counter() - t0
    calls.append((llm.engine.policy.lengths.iteration, feats.shape[0], round((time.perf_counter() - t0) * 1e3, 1)))
    return r
p.drafter.write_context = wc
print("PROMPTS", len(PROMPTS), "max_parked rows", p.max_parked)
for c in levels:
    acc.clear(); calls.clear()
    lp = ClosedLoop(llm, (PROMPTS * c)[:max(c, 32)], c, 64)
    while lp.busy: lp.step()
    print(f"c={c}: engine {lp.clock:.2f} s; writes " + ", ".join(f"{k}: {n} calls {r} rows {s * 1e3:.1f} ms"
                                                      for k, (n, r, s) in acc.items()), calls[:12] if c >= 16 else "", flush=True)
