# python idle_cprofile.py DTYPE C NAME: cProfile of whole engine steps (runner.run's inside excluded from the
# table's top by sorting on own time) for the AR engine (NAME=AR) or adaptive DFlash (NAME=DF) at C requests
import os, sys, cProfile, pstats, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, C, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
llm = LLM(speculative=False, **kw) if name == "AR" else LLM(draft=d, **kw)
lp = ClosedLoop(llm, (PROMPTS * C)[:max(C, 32)], C, 64)
for _ in range(4): lp.step()
pr = cProfile.Profile(); pr.enable()
for _ in range(40): lp.step()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(30)
