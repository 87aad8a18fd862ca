# python probe_cost.py DTYPE LEVELS: adaptive DFlash alone through the sweep's levels (e.g. 1,4,16,16): at the
# loaded levels (16+), each drafting step's time against the level's median step, and its context writes (rows and
# ms of each write; before a write, what the blocks it hit owed: owners and parked rows)
import os, sys, time, statistics, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]; levels = [int(c) for c in sys.argv[2].split(",")]
t, d = embedded_paths()
llm = LLM(draft=d, target=t, max_batch_size=32, dtype=dt)
e = llm.engine; p = e.proposer
cur = {"writes": [], "propose": 0.0}
fw = p.drafter.write_context
def wc(feats, *a, **k):
    t0 = time.perf_counter(); r = fw(feats, *a, **k)
    cur["writes"].append(("write", feats.shape[0], round((time.perf_counter() - t0) * 1e3, 2))); return r
p.drafter.write_context = wc
fh = p._hit_debts
def wh(*a, **k):  # the first draft after a prefix hit: owners' queues and parked parts go into its one write
    owners, parked = fh(*a, **k)
    cur["writes"].append(("hit debts", len(owners), sum(n for parts in parked for _, _, n in parts)))
    return owners, parked
p._hit_debts = wh
fp = p.propose
def prop(*a, **k):
    t0 = time.perf_counter(); r = fp(*a, **k); cur["propose"] = time.perf_counter() - t0; return r
p.propose = prop
for c in levels:
    lp = ClosedLoop(llm, (PROMPTS * c)[:max(c, 32)], c, 64)
    steps = []
    while lp.busy:
        cur["writes"], cur["propose"] = [], 0.0
        t0 = time.perf_counter(); lp.step(); dt_ = time.perf_counter() - t0
        steps.append((dt_, cur["propose"], list(cur["writes"])))
    if c >= 16:
        med = statistics.median(s[0] for s in steps)
        print(f"c={c}: median step {med * 1e3:.1f} ms; drafting steps (ms, propose ms, writes (whose, rows, ms)):")
        for s in steps:
            if s[1]:
                print(f"   {s[0] * 1e3:.1f} (+{(s[0] - med) * 1e3:.1f}), propose {s[1] * 1e3:.1f}, {s[2]}")
    else:
        print(f"c={c}: done", flush=True)
