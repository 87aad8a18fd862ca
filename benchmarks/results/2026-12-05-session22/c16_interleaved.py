# interleaved closed loops at concurrency cc: AR vs DFlash default; counts drafting steps
import sys, time, torch
torch.set_num_threads(2)
sys.path.insert(0, "/work/main/benchmarks")
from batching import PROMPTS, ClosedLoop
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
t, d = embedded_paths()
dt = sys.argv[1]; cc = int(sys.argv[2]); nreq = int(sys.argv[3]); rounds = int(sys.argv[4])
common = dict(target=t, max_batch_size=32, dtype=dt)
eng = {"AR": LLM(speculative=False, **common), "DF": LLM(draft=d, speculative=True, **common), "RD": LLM(draft=d, speculative=True, draft_len_schedule={1: 0}, **common)}
c = eng["DF"].engine.policy.costs
print("D(1) %.3f D(4) %.3f T(4) %.3f T(16) %.3f" % (c.drafter(1), c.drafter(4), c.target(4), c.target(16)))
for rnd in range(rounds):
    loops = {n: ClosedLoop(llm, (PROMPTS * 8)[:nreq], cc, 64) for n, llm in eng.items()}
    for llm in eng.values(): llm.engine.metrics.iterations.clear()
    while any(l.busy for l in loops.values()):
        for l in loops.values():
            if l.busy: l.step()
    fig = {n: l.figures() for n, l in loops.items()}
    its = eng["DF"].engine.metrics.iterations
    dsteps = sum(1 for i in its if i.drafted)
    st = {n: sum(i.seconds for i in e.engine.metrics.iterations) / len(e.engine.metrics.iterations) * 1e3 for n, e in eng.items()}
    print(" ".join(f"{n} {fig[n][0]:.1f} ({fig[n][0] / fig['AR'][0]:.3f}x, tau {fig[n][2]:.2f}) step {st[n]:.2f}ms" for n in eng),
          f"DF drafting steps {dsteps}/{len(its)}", flush=True)
