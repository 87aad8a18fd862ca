# python c32_split.py [float32|bfloat16] [CONCURRENCY]: AR, a never-drafting DFlash engine (K=0) and adaptive
# DFlash in batching.py's closed loop, one step each in turn, 2 rounds; per engine the time of each part of
# Engine.step (forward and greedy_tokens inside run), ms
import os, sys, time, torch, collections
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from batching import ClosedLoop, PROMPTS
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dtype = sys.argv[1] if len(sys.argv) > 1 else "float32"
C = int(sys.argv[2]) if len(sys.argv) > 2 else 32
t, d = embedded_paths()
common = dict(target=t, max_batch_size=C, dtype=dtype)
engines = {"AR": LLM(speculative=False, **common),
           "K=0": LLM(draft=d, speculative=True, draft_len_schedule={1: 0}, **common),
           "DFlash": LLM(draft=d, speculative=True, **common)}
acc = {n: collections.Counter() for n in engines}
def wrap(name, obj, attr):
    f = getattr(obj, attr)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); acc[name][attr] += time.perf_counter() - t0; return r
    setattr(obj, attr, g)
for n, llm in engines.items():
    e = llm.engine
    wrap(n, e.scheduler, "schedule"); wrap(n, e.scheduler, "postprocess"); wrap(n, e.runner, "run")
    wrap(n, e.runner, "commit"); wrap(n, e.target, "forward"); wrap(n, e.target, "greedy_tokens")
    wrap(n, e.proposer, "propose"); wrap(n, e.proposer, "observe"); wrap(n, e.policy, "cut")
    wrap(n, e, "verifier"); wrap(n, e.metrics, "record")
for rnd in range(2):
    for v in acc.values():
        v.clear()
    ps = (PROMPTS * C)[:max(C, 32)]
    loops = {n: ClosedLoop(llm, ps, C, 64) for n, llm in engines.items()}
    while any(lp.busy for lp in loops.values()):
        for lp in loops.values():
            if lp.busy:
                lp.step()
    for n, lp in loops.items():
        tok, _, tau = lp.figures()
        a = acc[n]
        other = lp.clock - sum(v for k, v in a.items() if k not in ("forward", "greedy_tokens"))
        print(f"{n:7s} clock {lp.clock:6.3f} s tok/s {tok:6.1f} tau {tau:.2f} | " +
              " ".join(f"{k} {v * 1e3:.0f}" for k, v in sorted(a.items())) + f" | step-other {other * 1e3:.0f} ms",
              flush=True)
