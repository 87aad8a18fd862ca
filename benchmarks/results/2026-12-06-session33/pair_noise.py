# python pair_noise.py DTYPE: the spread of a target pass's cost ratio (12 rows of 4 requests / 4 rows of 4) measured
# from adjacent passes (ref, point, ref: the point over the mean of its two refs), 40 times, against the ratio of
# the two passes taken as a calibration round takes them (each from its own round's figures)
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
for _ in range(3): run(0); run(2)
r = []
for i in range(40):
    a = run(0); b = run(2); c = run(0)
    r.append(b / ((a + c) / 2))
q = statistics.quantiles(r, n=10)
print(f"T(12)/T(4) from adjacent passes: median {statistics.median(r):.3f}, 10-90% {q[0]:.3f}-{q[-1]:.3f}")
meds = [statistics.median(r[i:i + 5]) for i in range(0, 40, 5)]
print("medians of 5:", " ".join(f"{m:.3f}" for m in meds))
