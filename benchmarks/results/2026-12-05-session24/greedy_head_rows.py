import time, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.plugins import invariant as bi
t, d = embedded_paths()
l = LLM(target=t, draft=d, dtype="bfloat16", draft_len_policy="fixed")
tg = l.engine.target
cap = []
f = tg.greedy_tokens
def g(*a, **k):
    cap.append(a); return f(*a, **k)
tg.greedy_tokens = g
l.generate(["Explain how a hash map handles collisions."], SamplingParams(max_tokens=96, ignore_eos=True), chat=True)
gh = tg.prepare_greedy_head()
xs = [a[0] for a in cap if a[0].shape[0] == 8]
print(len(xs), xs[0].shape, xs[0].dtype)
src = torch.ones(72 << 20)
import statistics
def T(name, fn, flush=False):
    ts = []
    for x in xs[:40] * 3:
        if flush: src.sum()
        t0 = time.perf_counter(); fn(x); ts.append(time.perf_counter() - t0)
    print(f"{name} median {statistics.median(ts)*1e6:.0f} us", flush=True)
for fl in (False, True):
    T(f"tokens 8 flush={fl}", gh.tokens, fl)
    T(f"tokens 1 flush={fl}", lambda x: gh.tokens(x[:1].contiguous()), fl)
    T(f"screen 8 flush={fl}", lambda x: bi.linear(x.float(), gh.screen), fl)
    T(f"full head 8 flush={fl}", lambda x: bi.linear(x, gh.packed), fl)
    T(f"full head 1 flush={fl}", lambda x: bi.linear(x[:1].contiguous(), gh.packed), fl)
from dflash_trt import ops
for fl in (True,):
    for m in (1, 2, 3, 4, 8):
        T(f"m={m} screen flush={fl}", lambda x: gh.tokens(x[:m].contiguous()), fl)
        T(f"m={m} full+argmax flush={fl}", lambda x: ops.head_argmax(x[:m].contiguous(), gh.packed), fl)
