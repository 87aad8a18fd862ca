# K chosen, accepted and step time per drafted step, DFlash default policy, c=1, humaneval prompts as peers
import sys, time, collections, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.bench.datasets import load_dataset, select
t, d = embedded_paths()
dt = sys.argv[1]; extra = dict(a.split("=") for a in sys.argv[2:])
kw = {k: (float(v) if "." in v else int(v) if v.isdigit() else v) for k, v in extra.items()}
l = LLM(target=t, draft=d, dtype=dt, max_batch_size=1, **kw)
ar = LLM(target=t, speculative=False, dtype=dt, max_batch_size=1, **{k: v for k, v in kw.items() if k == "weights"})
reqs, _ = select(load_dataset("humaneval").requests, 4)
tok = l.tokenizer
prompts = [r.prompt for r in reqs]
e = l.engine
stats = collections.defaultdict(lambda: [0, 0, 0.0])  # K -> steps, accepted, time
sp = SamplingParams(max_tokens=256, ignore_eos=True)
l.generate(prompts[:1], sp, chat=True); ar.generate(prompts[:1], sp, chat=True)
def run(llm, p):
    t0 = time.perf_counter(); o = llm.generate([p], sp, chat=True)[0]; return time.perf_counter() - t0, len(o.token_ids)
tot = {"AR": [0, 0], "DF": [0, 0]}
ar_steps = [0, 0.0]
for p in prompts:
    for name, llm in (("AR", ar), ("DF", l)):
        n0 = len(e.metrics.iterations); a0 = len(ar.engine.metrics.iterations)
        a, b = run(llm, p); tot[name][0] += a; tot[name][1] += b
        if name == "AR":
            for it in ar.engine.metrics.iterations[a0:]:
                if it.num_rows == 1: ar_steps[0] += 1; ar_steps[1] += it.seconds
        if name == "DF":
            for it in e.metrics.iterations[n0:]:
                s = stats[it.drafted]; s[0] += 1; s[1] += it.accepted; s[2] += it.seconds if hasattr(it, "seconds") else 0
print("AR tok/s %.1f DF tok/s %.1f ratio %.3f" % (tot["AR"][1]/tot["AR"][0], tot["DF"][1]/tot["DF"][0], (tot["DF"][1]/tot["DF"][0])/(tot["AR"][1]/tot["AR"][0])))
for k in sorted(stats): s = stats[k]; print(f"K={k}: steps {s[0]} accepted/step {s[1]/s[0]:.2f} ms/step {s[2]/s[0]*1e3:.2f}")
print(f"AR decode steps {ar_steps[0]} ms/step {ar_steps[1]/ar_steps[0]*1e3:.2f}")
