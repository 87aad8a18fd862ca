# python greedy_head_isa.py ; DFLASH_BI_ISA=avx512 python greedy_head_isa.py
# greedy head on captured verify states of a bf16 decode, 1 and 8 rows: whole op, its screen linear, its exact
# candidates' linear (median us), candidates per call; ISA from DFLASH_BI_ISA
import sys, time, statistics, torch
torch.set_num_threads(2)
import dflash_trt.plugins.invariant as bi
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
t, d = embedded_paths()
l = LLM(target=t, draft=d, dtype="bfloat16", draft_len_policy="fixed")
tg = l.engine.target
cap = []
f = tg.greedy_tokens
def g(*a, **k):
    cap.append(a); return f(*a, **k)
tg.greedy_tokens = g
for prompt in ("Explain how a hash map handles collisions.", "Write a haiku about the sea."):
    l.generate([prompt], SamplingParams(max_tokens=96, ignore_eos=True), chat=True)
gh = tg.prepare_greedy_head()
src = torch.ones(18 << 20)
def med(fn, xs):
    ts = []
    for _ in range(3):
        for x in xs:
            src.sum(); t0 = time.perf_counter(); fn(x); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6
for M in (1, 8):
    xs = [a[0][:M].contiguous() for a in cap if a[0].shape[0] == 8][:40]
    whole = med(gh.tokens, xs)
    xr = [x.to(torch.bfloat16).float() if gh.pairs else x.float() for x in xs]
    scr = med(lambda x: bi.linear(x, gh.screen, None, gh.chunks), xr)
    full = med(lambda x: bi.linear(x, gh.packed), xs)
    print(f"isa {bi.set_isa('')} pairs {gh.pairs} M={M}: op {whole:.0f} us, screen linear {scr:.0f}, full head {full:.0f}",
          flush=True)
