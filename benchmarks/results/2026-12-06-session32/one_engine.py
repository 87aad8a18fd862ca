# python one_engine.py ar|k1 C NREQ MAXTOK: one engine's closed loop (for perf), prints tok/s and steps
import os, sys, time, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
mode, cc, nreq, mt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype="bfloat16")
llm = LLM(speculative=False, **kw) if mode == "ar" else LLM(draft=d, draft_len_policy="fixed", max_draft_len=1, **kw)
lp = ClosedLoop(llm, (PROMPTS * cc)[:nreq], cc, mt)
print("PHASE", flush=True)
while lp.busy: lp.step()
f = lp.figures()
print(mode, f"tok/s {f[0]:.1f} tau {f[2]:.2f} clock {lp.clock:.2f}", flush=True)
