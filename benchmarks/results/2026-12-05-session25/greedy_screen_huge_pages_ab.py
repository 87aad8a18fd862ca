import time, statistics, torch, copy
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.huge_pages import move_to_huge_pages
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
gh2 = copy.copy(gh)
from dflash_trt.plugins.invariant import PackedLinear
gh2.screen = PackedLinear(gh.screen.data.clone(), gh.screen.n, gh.screen.k, gh.screen.scale.clone())
class Holder(torch.nn.Module):
    def __init__(self, p):
        super().__init__(); self.p = p
h = Holder(gh2.screen); print("moved", move_to_huge_pages(h) >> 20, "MB")
src = torch.ones(18 << 20)
res = {}
for rnd in range(3):
    for M in (1, 8):
        xs = [a[0][:M].contiguous() for a in cap if a[0].shape[0] == 8][:60]
        for name, o in (("4K", gh), ("2M", gh2)):
            ts = []
            for x in xs:
                src.sum()
                t0 = time.perf_counter(); o.tokens(x); ts.append(time.perf_counter() - t0)
            res.setdefault((name, M), []).append(statistics.median(ts))
for k, v in res.items(): print(k, " ".join(f"{x*1e6:.0f}" for x in v))
