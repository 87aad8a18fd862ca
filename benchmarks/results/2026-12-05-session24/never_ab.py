# AR vs DFlash that never drafts (begin_iteration -> 0) vs DFlash (default), interleaved per prompt, c=1
import sys, time, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
from dflash_trt.bench.datasets import load_dataset, select
t, d = embedded_paths()
kw = dict(dtype="bfloat16", weights=sys.argv[1], max_batch_size=1)
E = {"AR": LLM(target=t, speculative=False, **kw), "NEVER": LLM(target=t, draft=d, **kw), "DF": LLM(target=t, draft=d, **kw)}
E["NEVER"].engine.policy.begin_iteration = lambda n: 0
reqs, _ = select(load_dataset("humaneval").requests, 4)
sp = SamplingParams(max_tokens=256, ignore_eos=True)
for l in E.values(): l.generate([reqs[0].prompt], sp, chat=True)
for r in range(int(sys.argv[2])):
    tot = {n: [0.0, 0] for n in E}
    for q in reqs:
        for n, l in E.items():
            t0 = time.perf_counter(); o = l.generate([q.prompt], sp, chat=True)[0]; tot[n][0] += time.perf_counter() - t0; tot[n][1] += len(o.token_ids)
    b = tot["AR"][1] / tot["AR"][0]
    print(" ".join(f"{n} {v[1]/v[0]:.1f} ({v[1]/v[0]/b:.3f}x)" for n, v in tot.items()), flush=True)
