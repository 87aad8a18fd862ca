# The greedy head op on captured 8-row verify states of a bf16 decode (and their first rows), a 72 MB read before
# each call (as after a pass that streamed the weights); median us per call.
#   python greedy_head_ab.py old|new  -- the op of 56ddcef (its csrc copied to /work/scratch/inv_old: candidates
#                                        from whole panels, separate outlier/sum passes) or of this tree; run
#                                        alternately
#   python greedy_head_ab.py pages    -- this tree's screen codes on 4 KiB pages against a copy on 2 MiB pages
import copy, sys, time, statistics, torch
torch.set_num_threads(2)
mode = sys.argv[1]
import dflash_trt.plugins.invariant as inv
if mode == "old":
    inv._SOURCE = "/work/scratch/inv_old/invariant.cpp"
inv.load()
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.greedy_head import GreedyHead, MAX_CANDIDATES
from dflash_trt.huge_pages import move_to_huge_pages
from dflash_trt.plugins.invariant import PackedLinear
if mode == "old":
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
heads = {mode: gh}
if mode == "pages":
    class Holder(torch.nn.Module):
        def __init__(self, p):
            super().__init__(); self.p = p
    on4k = copy.copy(gh)
    on4k.screen = PackedLinear(gh.screen.data.clone(), gh.screen.n, gh.screen.k, gh.screen.scale.clone())
    huge = copy.copy(gh)
    huge.screen = PackedLinear(gh.screen.data.clone(), gh.screen.n, gh.screen.k, gh.screen.scale.clone())
    move_to_huge_pages(Holder(huge.screen))
    heads = {"4K": on4k, "2M": huge}
src = torch.ones(18 << 20)
out = []
for rnd in range(3 if mode == "pages" else 1):
    for M in (1, 8):
        xs = [a[0][:M].contiguous() for a in cap if a[0].shape[0] == 8][:60]
        ref = [tg.logits(x).argmax(-1) for x in xs]
        for name, h in heads.items():
            ts, toks = [], []
            for x in xs * (1 if mode == "pages" else 3):
                src.sum()
                t0 = time.perf_counter(); r = h.tokens(x); ts.append(time.perf_counter() - t0)
                toks.append(r)
            assert all(r is None or torch.equal(r, rf) for r, rf in zip(toks, ref * 3))
            out.append(f"{name} M={M} {statistics.median(ts)*1e6:.0f}us")
print(" ".join(out), flush=True)
