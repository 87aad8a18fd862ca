# python pair_noise2.py DTYPE: target passes of 4 requests x 1, 2, 3 rows (4, 8, 12 rows), 60 rounds in turn:
# the distribution of T(8)/T(4) and T(12)/T(4) within a round (deciles), to see the calibration's spread
import sys, time, statistics, torch
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from dflash_trt.sampling import SamplingParams
from dflash_trt.scheduler import Scheduled
from dflash_trt.sequence import Sequence
t, d = embedded_paths()
llm = LLM(target=t, draft=d, max_batch_size=32, dtype=sys.argv[1])
e = llm.engine; runner, blocks = e.runner, e.blocks
CTX = 48
seqs = []
for _ in range(4):
    s = Sequence([0] * CTX, SamplingParams(max_tokens=8, seed=0)); s.token_ids.append(0)
    blocks.grow(s, CTX + 8); seqs.append(s)
def run(drafts):
    for s in seqs: s.num_computed = CTX
    t0 = time.perf_counter()
    runner.run([Scheduled(s, drafts + 1, drafts, False) for s in seqs],
               {s.seq_id: [0] * drafts for s in seqs} if drafts else {})
    return time.perf_counter() - t0
for _ in range(3): run(0); run(1); run(2)
r8, r12 = [], []
for i in range(60):
    a = run(0); b = run(1); c = run(2)
    r8.append(b / a); r12.append(c / a)
for name, r in (("T(8)/T(4)", r8), ("T(12)/T(4)", r12)):
    q = statistics.quantiles(r, n=10)
    print(f"{name}: median {statistics.median(r):.3f}, deciles " + " ".join(f"{x:.3f}" for x in q))
print("medians of 5 rounds, T(12)/T(4):", " ".join(f"{statistics.median(r12[i:i + 5]):.3f}" for i in range(0, 60, 5)))
print("medians of 5 rounds, T(8)/T(4): ", " ".join(f"{statistics.median(r8[i:i + 5]):.3f}" for i in range(0, 60, 5)))
