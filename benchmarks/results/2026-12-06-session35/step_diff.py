# python step_diff.py DTYPE LEVELS: adaptive DFlash beside a DFlash engine that never drafts (K=0), one step of each in
# turn through the sweep's levels: per level, the total step time of each, and the iterations where DFlash's step
# differs most from K=0's at the same iteration (index, DF ms, K=0 ms, DF batch, drafted)
import os, sys, time, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]; levels = [int(c) for c in sys.argv[2].split(",")]
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
E = {"DF": LLM(draft=d, **kw), "K=0": LLM(draft=d, draft_len_schedule={1: 0}, **kw)}
for c in levels:
    ps = (PROMPTS * c)[:max(c, 32)]
    loops = {n: ClosedLoop(llm, ps, c, 64) for n, llm in E.items()}
    times = {n: [] for n in E}
    while any(lp.busy for lp in loops.values()):
        for n, lp in loops.items():
            if lp.busy:
                t0 = time.perf_counter(); lp.step(); times[n].append(time.perf_counter() - t0)
    its = {n: E[n].engine.metrics.iterations[-len(times[n]):] for n in E}
    tot = {n: sum(v) for n, v in times.items()}
    print(f"c={c}: steps DF {len(times['DF'])} K=0 {len(times['K=0'])}; total s DF {tot['DF']:.3f} K=0 {tot['K=0']:.3f} "
          f"({tot['DF'] / tot['K=0']:.3f}); tok/s DF {loops['DF'].figures()[0]:.1f} K=0 {loops['K=0'].figures()[0]:.1f}")
    n = min(len(times["DF"]), len(times["K=0"]))
    diffs = sorted(range(n), key=lambda i: -abs(times["DF"][i] - times["K=0"][i]))[:8]
    print("   ", [(i, round(times["DF"][i] * 1e3, 1), round(times["K=0"][i] * 1e3, 1), its["DF"][i].batch_size,
                  its["K=0"][i].batch_size, its["DF"][i].drafted) for i in sorted(diffs)], flush=True)
