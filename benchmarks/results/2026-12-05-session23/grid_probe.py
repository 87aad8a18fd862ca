# Real step costs by requests x K: target passes (runner.run) and drafter passes (propose, trimmed where several
# requests draft) on scratch requests of CONTEXT cached positions, median of 5 rounds, and the calibrated
# model's ratios beside them.   python grid_probe.py [CONTEXT] [DTYPE]
import sys, torch
torch.set_num_threads(2)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
import dflash_trt.spec.calibrate as cal
from dflash_trt.scheduler import Scheduled
from dflash_trt.sequence import Sequence
from dflash_trt.sampling import SamplingParams
t, d = embedded_paths()
e = LLM(target=t, draft=d, max_batch_size=32, dtype=sys.argv[2] if len(sys.argv) > 2 else "bfloat16").engine
runner, proposer, blocks, k = e.runner, e.proposer, e.blocks, 3
CONTEXT = int(sys.argv[1]) if len(sys.argv) > 1 else 48
seqs = []
for _ in range(16):
    s = Sequence([0] * CONTEXT, SamplingParams(max_tokens=k + 1, seed=0)); s.token_ids.append(0)
    blocks.grow(s, CONTEXT + k + 1); seqs.append(s)
def decode(g): runner.run([Scheduled(s, 1, 0, False) for s in g], {})
def verify(g, kk=k): runner.run([Scheduled(s, kk + 1, kk, False) for s in g], {s.seq_id: [0] * kk for s in g})
def draft(g, kk=k):
    for s in g:
        pos = torch.arange(CONTEXT - kk - 1, CONTEXT); table = torch.tensor(s.block_table)
        slots = table[pos // blocks.block_size] * blocks.block_size + pos % blocks.block_size
        dd = proposer.drafter; width = len(dd.cfg.target_layer_ids) * dd.cfg.hidden_size
        proposer.queue(s, (torch.zeros(kk + 1, width, dtype=torch.bfloat16), pos, slots))
    proposer.propose([Scheduled(s, kk + 1, kk, False) for s in g])
import time
runs = {}
for B in (1, 4, 8, 16):
    runs[f"T{B},0"] = (decode, B, {})
    for kk in (1, 2, 3):
        runs[f"T{B},{kk}"] = (verify, B, dict(kk=kk))
        runs[f"D{B},{kk}"] = (draft, B, dict(kk=kk))
res = {n: [] for n in runs}
for r in range(6):
    for n, (fn, B, kw) in runs.items():
        for s in seqs[:B]: s.num_computed = CONTEXT
        t0 = time.perf_counter(); fn(seqs[:B], **kw); res[n].append(time.perf_counter() - t0)
med = {n: sorted(v[1:])[len(v[1:]) // 2] * 1e3 for n, v in res.items()}
for B in (1, 4, 8, 16):
    print(f"B={B}: T0 {med[f'T{B},0']:.2f} ms | " + " | ".join(f"K{kk}: T {med[f'T{B},{kk}']:.2f} D {med[f'D{B},{kk}']:.2f} ratio {(med[f'T{B},{kk}'] + med[f'D{B},{kk}']) / med[f'T{B},0']:.3f}" for kk in (1, 2, 3)))
c = e.policy.costs
for B in (4, 8):
    print(f"model B={B}: " + " ".join(f"K{kk} {(c.target(B * (kk + 1)) + c.drafter(B, kk)) / c.target(B):.3f}" for kk in (1, 2, 3)))
