# python engine_ab.py CONCS [NREQ] [MAXTOK]: bf16 AR and DFlash engines with the AMX pass's two tile sets (AMXM=0,
# the old kernel) and one set (AMXM=1, the new), stepped in turn in one process; aggregate tok/s per engine
# the scratch build: `git show 712e4ae:plugins/csrc/invariant.cpp` with amxm_switch.patch applied, in /tmp/pf2 beside
# copies of plugins/csrc/*.h, *.cuh and invariant_layer.cpp (AMXM=0: two tile sets as 712e4ae, its blocks in
# the new order; AMXM=1: one set, as 9d437ab)
import sys, os, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from dflash_trt.plugins import invariant as inv
inv._SOURCE = "/tmp/pf2/invariant.cpp"
inv.load()
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
concs = [int(c) for c in sys.argv[1].split(",")]
nreq = int(sys.argv[2]) if len(sys.argv) > 2 else 32
mt = int(sys.argv[3]) if len(sys.argv) > 3 else 64
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype="bfloat16")
E = {}
for m in "01":
    os.environ["AMXM"] = m
    E["AR" + m] = (m, LLM(speculative=False, **kw))
    E["DF" + m] = (m, LLM(draft=d, **kw))
    print(m, E["DF" + m][1].engine.policy.costs.curve, flush=True)
for cc in concs:
    ps = (PROMPTS * cc)[:max(cc, nreq)]
    L = {n: (m, ClosedLoop(l, ps, cc, mt)) for n, (m, l) in E.items()}
    while any(lp.busy for _, lp in L.values()):
        for m, lp in L.values():
            if lp.busy:
                os.environ["AMXM"] = m
                lp.step()
    f = {n: lp.figures() for n, (_, lp) in L.items()}
    print(f"c={cc} " + " ".join(f"{n} {f[n][0]:.1f} (tau {f[n][2]:.2f})" for n in E) +
          f" | new/old AR {f['AR1'][0]/f['AR0'][0]:.3f} DF {f['DF1'][0]/f['DF0'][0]:.3f}"
          f" | DF/AR old {f['DF0'][0]/f['AR0'][0]:.3f} new {f['DF1'][0]/f['AR1'][0]:.3f}", flush=True)
