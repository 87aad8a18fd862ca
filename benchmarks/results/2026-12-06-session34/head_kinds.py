# python head_kinds.py [ROWS,...]: the greedy screen against the full head (head_argmax) by the head's panels:
# fp32, widened bf16 (an fp32 model whose values are bf16 numbers) and bf16 k-pairs, on real decode states of
# the embedded target (fp32 engine), ms per call (median of 20, alternated)
import os, sys, time, statistics, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM, ops
from dflash_trt.embedded import embedded_paths
from dflash_trt.greedy_head import GreedyHead
t, d = embedded_paths()
llm = LLM(target=t, speculative=False, max_batch_size=32, dtype="float32")
tg = llm.engine.runner.target
seen = []
f = tg.greedy_tokens
tg.greedy_tokens = lambda h: (seen.append(h.clone()), f(h))[1]
lp = ClosedLoop(llm, PROMPTS[:16], 16, 40)
while lp.busy: lp.step()
X = torch.cat(seen[2:])
w32 = tg.head_weight.data.float()
kinds = {"fp32": (w32, X), "widened bf16": (w32.to(torch.bfloat16).float(), X),
         "bf16 pairs": (w32.to(torch.bfloat16), X.to(torch.bfloat16))}
NS = [int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 4, 8, 12, 16, 24, 32]
for name, (w, x_all) in kinds.items():
    packed = ops.pack(w)
    gh = GreedyHead(w, packed); gh.observe(x_all[:64]); assert gh.armed
    print(name, "panels", packed.data.dtype)
    for n in NS:
        full, scr = [], []
        for i in range(20):
            x = x_all[(i * 7) % (x_all.shape[0] - n):][:n].contiguous()
            t0 = time.perf_counter(); a = ops.head_argmax(x, packed)[0]; full.append(time.perf_counter() - t0)
            t0 = time.perf_counter(); b = gh.tokens(x); scr.append(time.perf_counter() - t0)
            assert b is not None and torch.equal(a, b)
        print(f"  {n:3d} rows: full {statistics.median(full) * 1e3:7.3f} ms, screen {statistics.median(scr) * 1e3:7.3f} ms"
              f" ({statistics.median(full) / statistics.median(scr):.2f}x)", flush=True)
