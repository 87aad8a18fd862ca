# in-process A/B in real decoding (spec_limit's setup): flag 0 = session-start paths, 1 = new; per prompt alternating.
# insitu_ab.py WEIGHTS DTYPE ROUNDS [OPS]: OPS the A/B build's switches, comma-separated (default bi_set_ab);
# PP=path: run that round-trip probe at the end
import sys, statistics, torch
sys.path.insert(0, "/work/main/benchmarks")
import spec_limit as S
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
wts, dt = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3])
ops = (sys.argv[4] if len(sys.argv) > 4 else "bi_set_ab").split(",")
switch = lambda on: [getattr(torch.ops.dflash_trt, o)(on) for o in ops]
t, d = embedded_paths()
eng = {"dtype": dt, "weights": wts}
ar = LLM(target=t, speculative=False, **eng)
sd = LLM(target=t, draft=d, draft_len_policy="fixed", **eng)
fa, fv = S.Timed(ar.engine.target, "forward"), S.Timed(sd.engine.target, "forward")
ha, hv = S.Heads(ar.engine.target), S.Heads(sd.engine.target)
sp = SamplingParams(max_tokens=128, ignore_eos=True)
S.decode(ar, SamplingParams(max_tokens=8, ignore_eos=True), []); S.decode(sd, SamplingParams(max_tokens=8, ignore_eos=True), [])
res = {0: {"ar": [], "v": []}, 1: {"ar": [], "v": []}}
for r in range(rounds):
    for i, p in enumerate(S.PROMPTS):
        for f in ((0, 1) if (r + i) % 2 else (1, 0)):
            switch(bool(f))
            for eng_, ft, ht, key in ((ar, fa, ha, "ar"), (sd, fv, hv, "v")):
                n0, h0 = len(ft.times), len(ht.times)
                S.decode(eng_, sp, [], [p])
                f_t = ft.times[n0:]; h_t = ht.times[h0:]
                res[f][key].append((statistics.median(f_t), sum(h_t) / len(f_t)))
switch(True)
for f in (0, 1):
    a = statistics.median([x + y for x, y in res[f]["ar"]]) * 1e3
    v = statistics.median([x + y for x, y in res[f]["v"]]) * 1e3
    print(f"{dt} {wts} flag {f}: t_AR {a:.2f} ms, t_verify {v:.2f} ms, ratio {v / a:.3f}")
print("new/old t_AR %.3f, t_verify %.3f" % tuple(statistics.median([x + y for x, y in res[1][k]]) / statistics.median([x + y for x, y in res[0][k]]) for k in ("ar", "v")), flush=True)
pp = __import__("os").environ.get("PP")  # a round-trip probe (session 38's pp.c) to run after the measurement
if pp:
    import subprocess
    print(subprocess.run([pp, "1"], capture_output=True, text=True).stdout.strip(), flush=True)
