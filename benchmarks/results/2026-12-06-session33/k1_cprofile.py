# python k1_cprofile.py DTYPE C MODE: cProfile over 30 steady steps of one engine at C requests (MODE ar | k1)
import os, sys, torch, cProfile, pstats
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, C, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
llm = LLM(speculative=False, **kw) if mode == "ar" else LLM(draft=d, draft_len_policy="fixed", max_draft_len=1, **kw)
lp = ClosedLoop(llm, (PROMPTS * C)[:32], C, 64)
for _ in range(8): lp.step()
pr = cProfile.Profile(); pr.enable()
for i in range(30): lp.step()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(35)
