# python c1_cprofile.py DTYPE MODE [N]: cProfile over N steady steps of one request (MODE ar | adaptive), by own time
import os, sys, cProfile, pstats, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
torch.set_num_threads(2)
from batching import ClosedLoop, PROMPTS
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
dt, mode = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 60
t, d = embedded_paths()
kw = dict(target=t, max_batch_size=32, dtype=dt)
llm = LLM(speculative=False, **kw) if mode == "ar" else LLM(draft=d, **kw)
lp = ClosedLoop(llm, PROMPTS[:4], 1, 512)
for _ in range(10): lp.step()
pr = cProfile.Profile(); pr.enable()
for i in range(N): lp.step()
pr.disable()
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(45)
