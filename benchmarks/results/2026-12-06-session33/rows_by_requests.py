# python rows_by_requests.py DTYPE: target passes of 32 rows as 8 requests x 4 rows (the calibration's verify point)
# and as 16 requests x 2 rows (K = 1 at 16 requests), and 16 x 1 rows, 40 rounds in turn: medians of the ratios
import sys, time, statistics, torch
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from dflash_trt.sampling import SamplingParams
from dflash_trt.scheduler import Scheduled
from dflash_trt.sequence import Sequence
t, d = embedded_paths()
llm = LLM(target=t, draft=d, max_batch_size=32, dtype=sys.argv[1], draft_len_policy="fixed")
e = llm.engine; runner, blocks = e.runner, e.blocks
CTX = 48
seqs = []
for _ in range(16):
    s = Sequence([0] * CTX, SamplingParams(max_tokens=8, seed=0)); s.token_ids.append(0)
    blocks.grow(s, CTX + 8); seqs.append(s)
def run(n, drafts):
    g = seqs[:n]
    for s in g: s.num_computed = CTX
    t0 = time.perf_counter()
    runner.run([Scheduled(s, drafts + 1, drafts, False) for s in g],
               {s.seq_id: [0] * drafts for s in g} if drafts else {})
    return time.perf_counter() - t0
for _ in range(10): run(1, 7)  # arm the greedy screen
for _ in range(3): run(16, 0); run(8, 3); run(16, 1)
a, b = [], []
for i in range(40):
    w = run(16, 0); v = run(8, 3); k = run(16, 1)
    a.append(v / w); b.append(k / w)
print(f"{sys.argv[1]}: T(8 x 4)/T(16 x 1) median {statistics.median(a):.3f}; "
      f"T(16 x 2)/T(16 x 1) median {statistics.median(b):.3f};"
      f" ratio {statistics.median(b) / statistics.median(a):.3f}")
