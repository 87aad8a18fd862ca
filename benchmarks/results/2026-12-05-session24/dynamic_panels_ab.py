# AR decode A/B in one process: static vs dynamic (guided) panel split, alternating per prompt
import os, sys, time, torch
torch.set_num_threads(2)
from dflash_trt import LLM, SamplingParams
from dflash_trt.embedded import embedded_paths
sys.path.insert(0, "/work/main/benchmarks")
from spec_limit import PROMPTS
t, d = embedded_paths()
dt = sys.argv[1]; rounds = int(sys.argv[2]); modes = sys.argv[3].split(","); spec = len(sys.argv) > 4
l = LLM(target=t, draft=d if spec else None, speculative=spec, dtype=dt, max_batch_size=1)
sp = SamplingParams(max_tokens=128, ignore_eos=True)
l.generate(PROMPTS[:1], sp, chat=True)
for r in range(rounds):
    tot = {m: [0.0, 0] for m in modes}
    for p in PROMPTS:
        for m in modes:
            os.environ["BI_DYN"] = m
            t0 = time.perf_counter(); o = l.generate([p], sp, chat=True)[0]; tot[m][0] += time.perf_counter() - t0; tot[m][1] += len(o.token_ids)
    b = tot[modes[0]][1] / tot[modes[0]][0]
    print(" ".join(f"dyn={m} {v[1]/v[0]:.1f} ({v[1]/v[0]/b:.3f}x)" for m, v in tot.items()), flush=True)
