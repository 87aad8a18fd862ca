# The bf16 target's 120 linears at 8 rows through bi_linear against the bare k-pair loop of session 25's
# bare_8rows.c (gcc -O3 -mavx512f -mavx512bf16 -fopenmp -shared -fPIC bare_8rows.c -o /work/scratch/libbare8.so),
# interleaved in one process, ms per pass: python library_vs_bare_8rows.py THREADS ROUNDS
import ctypes, time, sys, torch, collections, statistics
NT = int(sys.argv[1])
torch.set_num_threads(NT)
from dflash_trt import LLM
from dflash_trt.embedded import embedded_paths
from dflash_trt.plugins import invariant as bi
lib = ctypes.CDLL("/work/scratch/libbare8.so")
t, d = embedded_paths()
ar = LLM(target=t, dtype="bfloat16", speculative=False)
tg = ar.engine.target
packs = []
for l in tg.model.layers:
    packs += [l.self_attn.qkv.packed, l.self_attn.o_proj.packed, l.mlp.gate_up.packed, l.mlp.down_proj.packed]
xs8 = {k: torch.randn(8, k).to(torch.bfloat16) for k in (576, 1536)}
xh = {k: x.view(torch.int32).t().contiguous().view(-1) for k, x in xs8.items()}
outb = torch.empty(200 * 256)
op = bi.binding("bi_linear")
args = [(ctypes.c_void_p(p.data.data_ptr()), ctypes.c_long(p.data.shape[0]), ctypes.c_long(p.k // 2),
         ctypes.c_void_p(xh[p.k].data_ptr()), ctypes.c_void_p(outb.data_ptr()), ctypes.c_int(NT)) for p in packs]
src = torch.ones(64 << 20)
def lib_run():
    for p in packs: op(xs8[p.k], p.data, p.n, None, 1, p.scale)
def bare_run():
    for a in args: lib.run8(*a)
res = collections.defaultdict(list)
for i in range(int(sys.argv[2])):
    for name, fn in (("lib", lib_run), ("bare", bare_run)):
        src.sum(); t0 = time.perf_counter(); fn(); res[name].append(time.perf_counter() - t0)
for k, v in res.items(): print(k, statistics.median(v) * 1e3, "ms")
