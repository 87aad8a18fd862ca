# The greedy head op (runtime/greedy_head.py) on captured verify states of a bf16 decode, at 1 and 8 rows, with a
# 72 MB read before each call: median us per call; every token checked against the full logits' argmax.
#   python greedy_head_ab.py old  -- ac01d99's op (git show ac01d99:plugins/csrc/invariant.cpp > OLD/invariant.cpp,
#                                    argmax_row.h beside it; OLD below), the outlier columns in fp32
#   python greedy_head_ab.py new  -- this tree's (bf16 outlier columns, 8 rows per pass)
import sys, time, statistics, torch
torch.set_num_threads(2)
mode = sys.argv[1]
import dflash_trt.plugins.invariant as inv
if mode == "old": inv._SOURCE = sys.argv[2] if len(sys.argv) > 2 else "OLD/invariant.cpp"
inv.load()
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.greedy_head import GreedyHead
if mode == "old":
    _obs = GreedyHead.observe
    def observe(self, x):
        _obs(self, x)
        if self.armed: self.wo = self.wo.float().contiguous()
    GreedyHead.observe = observe
t, d = embedded_paths()
l = LLM(target=t, draft=d, dtype="bfloat16", draft_len_policy="fixed")
tg = l.engine.target
cap = []
f = tg.greedy_tokens
def g(*a, **k):
    cap.append(a); return f(*a, **k)
tg.greedy_tokens = g
for prompt in ("Explain how a hash map handles collisions.", "Write a haiku about the sea."):  # one at a time: 8-row steps
    l.generate([prompt], SamplingParams(max_tokens=96, ignore_eos=True), chat=True)
gh = tg.prepare_greedy_head()
if mode == "old": gh.wo = gh.wo.float().contiguous()
src = torch.ones(18 << 20)
out = []
for M in (1, 8):
    xs = [a[0][:M].contiguous() for a in cap if a[0].shape[0] == 8][:60]
    ref = [tg.logits(x).argmax(-1) for x in xs]
    ts = []
    for _ in range(5):
        for x, rf in zip(xs, ref):
            src.sum()
            t0 = time.perf_counter(); r = gh.tokens(x); ts.append(time.perf_counter() - t0)
            assert r is not None and torch.equal(r, rf)
    out.append(f"M={M} {statistics.median(ts)*1e6:.0f}us")
print(mode, gh.wo.dtype, " ".join(out), flush=True)
