# python plan_trace.py DTYPE C [warm]: the adaptive engine at concurrency C (32 requests, 64 tokens): per iteration the
# batch, the planned K and the requests' estimates; then how many iterations drafted and how long K = 0 lasted
import os, sys, collections, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from dflash_trt.spec.policy import trusted_p, margin_for
dt, C = sys.argv[1], int(sys.argv[2])
t, d = embedded_paths()
llm = LLM(target=t, draft=d, max_batch_size=32, dtype=dt)
e = llm.engine; pol = e.policy
rows = []
op = e.proposer.propose
def prop(work, *a, **k):
    rows[-1]["drafted"] = [w.draft_len for w in work]
    return op(work, *a, **k)
e.proposer.propose = prop
sc = e.scheduler; f = sc.schedule
def sched():
    out = f()
    dec = [w.seq for w in out if not w.is_prefill]
    rows.append(dict(it=pol.lengths.iteration, n=len(dec), planned=pol.planned, drafted=[],
                     p=[s.acceptance.p for s in dec if s.acceptance], tp=[trusted_p(s.acceptance, len(dec)) for s in dec if s.acceptance],
                     floor=pol.lengths.floor(7, len(dec)) if dec else 0))
    return out
sc.schedule = sched
if sys.argv[-1] == "warm":  # the sweep's level at 1 request first, on the same engine (as batching.py runs it)
    w = ClosedLoop(llm, PROMPTS[:32], 1, 64)
    while w.busy: w.step()
    rows.clear()
lp = ClosedLoop(llm, (PROMPTS * C)[:max(C, 32)], C, 64)
while lp.busy: lp.step()
drafting = sum(1 for r in rows if any(r["drafted"]))
print(f"{len(rows)} iterations, {drafting} drafted; engine rate {pol.lengths.engine_rate.p:.3f}; tok/s {lp.figures()[0]:.1f} tau {lp.figures()[2]:.2f}")
runs, cur = [], 0
for r in rows:
    if any(r["drafted"]): 
        if cur: runs.append(cur)
        cur = 0
    else: cur += 1
print("K=0 stretches:", sorted(collections.Counter(runs).items()))
print("K by iteration:", "".join(str(max(r["drafted"], default=0)) for r in rows))
for r in rows[::max(1, len(rows) // 40)]:
    print(r["it"], r["n"], "planned", r["planned"], "drafted", r["drafted"], "p", " ".join(f"{x:.2f}" for x in r["p"]), "| tp", " ".join(f"{x:.2f}" for x in r["tp"]))
