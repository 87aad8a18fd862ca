# python head_rows.py DTYPE [ROWS,...]: the target's greedy head at 1-48 rows of real decode states: the full head with its
# argmax (head_argmax) against the exact screen (GreedyHead.tokens, any rows), ms per call (median of 30,
# alternated), and whether their tokens agree
import os, sys, time, statistics, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM, ops
from dflash_trt.embedded import embedded_paths
dt = sys.argv[1]
t, d = embedded_paths()
llm = LLM(target=t, speculative=False, max_batch_size=32, dtype=dt)
tg = llm.engine.runner.target
seen = []
f = tg.greedy_tokens
def g(h):
    seen.append(h.clone()); return f(h)
tg.greedy_tokens = g
lp = ClosedLoop(llm, PROMPTS[:16], 16, 48)
while lp.busy: lp.step()
tg.greedy_tokens = f
X = torch.cat(seen[2:])  # decode rows
gh = tg.prepare_greedy_head(); gh.observe(X[:64]); assert gh.armed
print(dt, "rows", X.shape, "head panels", tg.head_packed.data.dtype)
NS = [int(v) for v in sys.argv[2].split(',')] if len(sys.argv) > 2 else [1, 4, 8, 12, 16, 24, 32, 48]
for n in NS:
    full, scr, ok, none = [], [], True, 0
    for i in range(30 if n < 100 else 10):
        x = X[(i * 7) % (X.shape[0] - n):][:n].contiguous()
        t0 = time.perf_counter(); a = ops.head_argmax(x, tg.head_packed)[0]; full.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); b = gh.tokens(x); scr.append(time.perf_counter() - t0)
        none += b is None
        ok = ok and (b is None or torch.equal(a, b))
    print(f"{n:3d} rows: full {statistics.median(full) * 1e3:7.3f} ms, screen {statistics.median(scr) * 1e3:7.3f} ms, "
          f"agree {ok}, declined {none}/30")
