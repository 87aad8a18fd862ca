# in-process A/B: the greedy screen (up to 8 rows) vs the full head + one-op argmax, AR (1 row) and DFlash at a
# fixed K (K + 1 rows). python head_ab.py DTYPE ROUNDS [WEIGHTS] [K]
import sys, time, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
sys.path.insert(0, "/work/main/benchmarks")
from spec_limit import PROMPTS
t, d = embedded_paths()
dt = sys.argv[1]; rounds = int(sys.argv[2]); wts = sys.argv[3] if len(sys.argv) > 3 else "auto"
kd = dict(max_draft_len=int(sys.argv[4])) if len(sys.argv) > 4 else {}  # fixed K (default block - 1)
kw = dict(dtype=dt, max_batch_size=1, weights=wts)
E = {"AR-screen": LLM(target=t, speculative=False, **kw), "AR-full": LLM(target=t, speculative=False, **kw),
     "DF-screen": LLM(target=t, draft=d, draft_len_policy="fixed", **kd, **kw), "DF-full": LLM(target=t, draft=d, draft_len_policy="fixed", **kd, **kw)}
sp = SamplingParams(max_tokens=128, ignore_eos=True)
for n, l in E.items():
    l.generate(PROMPTS[:1], sp, chat=True)
    gh = l.engine.target.prepare_greedy_head()
    print(n, "screen" if gh is not None else "no screen", flush=True)
    if n.endswith("full") and gh is not None: gh.max_rows = 0
    if n.endswith("screen") and gh is not None: gh.max_rows = 8  # the screen up to 8 rows (before this session)
head = {n: [0.0, 0] for n in E}
for n, l in E.items():
    tg = l.engine.target; f = tg.greedy_tokens
    def g(h, f=f, n=n):
        t0 = time.perf_counter(); r = f(h); head[n][0] += time.perf_counter() - t0; head[n][1] += 1; return r
    tg.greedy_tokens = g
outs = {}
for r in range(rounds):
    tot = {n: [0.0, 0] for n in E}
    for p in PROMPTS:
        for n, l in E.items():
            t0 = time.perf_counter(); o = l.generate([p], sp, chat=True)[0]; tot[n][0] += time.perf_counter() - t0; tot[n][1] += len(o.token_ids)
            outs.setdefault((n[:2], p), []).append(o.token_ids)
    print(" ".join(f"{n} {v[1]/v[0]:.1f}" for n, v in tot.items()),
          f"| AR full/screen {tot['AR-full'][1]/tot['AR-full'][0]/(tot['AR-screen'][1]/tot['AR-screen'][0]):.3f}",
          f"DF full/screen {tot['DF-full'][1]/tot['DF-full'][0]/(tot['DF-screen'][1]/tot['DF-screen'][0]):.3f}", flush=True)
print("head us/call:", " ".join(f"{n} {v[0]/v[1]*1e6:.0f}" for n, v in head.items()))
print("all outputs equal:", all(all(x == v[0] for x in v) for v in outs.values()))
