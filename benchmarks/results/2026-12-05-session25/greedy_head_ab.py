# old (HEAD's invariant.cpp: candidates from whole panels, separate outlier/sum passes) vs new greedy head op,
# on captured verify states, a 72 MB read before each call (as after a pass that streamed the weights)
import os, sys, time, statistics, torch
torch.set_num_threads(2)
old = sys.argv[1] == "old"
import dflash_trt.plugins.invariant as inv
if old:
    inv._SOURCE = "/work/scratch/inv_old/invariant.cpp"
inv.load()
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.greedy_head import GreedyHead, MAX_CANDIDATES
if old:
    def tokens(self, x):
        if not self.armed: return None
        gap = 2.0 ** -5 if x.dtype == torch.bfloat16 else 0.0
        ids = inv.binding("bi_greedy_head")(x, self.pairs, self.out_idx, self.screen.data, self.screen.n, self.screen.scale,
            self.chunks, self.wo, self.g, self.g_max, gap, self.packed.data, MAX_CANDIDATES)
        return ids if ids.numel() else None
    GreedyHead.tokens = tokens
t, d = embedded_paths()
l = LLM(target=t, draft=d, dtype="bfloat16", draft_len_policy="fixed")
tg = l.engine.target
cap = []
f = tg.greedy_tokens
def g(*a, **k):
    cap.append(a); return f(*a, **k)
tg.greedy_tokens = g
l.generate(["Explain how a hash map handles collisions.", "Write a haiku about the sea."], SamplingParams(max_tokens=96, ignore_eos=True), chat=True)
gh = tg.prepare_greedy_head()
src = torch.ones(18 << 20)
out = []
for M in (1, 8):
    xs = [a[0][:M].contiguous() for a in cap if a[0].shape[0] == 8][:60]
    ts = []
    toks = []
    for x in xs * 3:
        src.sum()
        t0 = time.perf_counter(); r = gh.tokens(x); ts.append(time.perf_counter() - t0)
        toks.append(r)
    ref = [tg.logits(x).argmax(-1) for x in xs]
    assert all(r is None or torch.equal(r, rf) for r, rf in zip(toks, ref * 3))
    out.append(f"M={M} {statistics.median(ts)*1e6:.0f}us")
print(sys.argv[1], " ".join(out), flush=True)
