# The bf16 target's 120 linears (qkv, o, gate_up, down x 30, in the engine's huge-page arena) at 1 and 8 rows
# through bi_linear, against a bare 8-row k-pair loop (bare_8rows.c) on the same memory, and the two paths' call
# costs alone; a 256 MB read before each pass, rounds interleaved. `python bare_vs_library_8rows.py THREADS`
# gcc -O3 -mavx512f -mavx512bf16 -fopenmp -shared -fPIC bare_8rows.c -o /work/scratch/libbare8.so
import ctypes, time, statistics, torch, collections
torch.set_num_threads(2)
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
xs1 = {k: x[:1].contiguous() for k, x in xs8.items()}
xh = {k: x.view(torch.int32).t().contiguous().view(-1) for k, x in xs8.items()}
outb = torch.empty(200 * 256)
op = bi.binding("bi_linear")
tiny = bi.pack_linear_bf16_pairs(torch.randn(64, 576).to(torch.bfloat16))  # 2 panels: two threads at 8 rows
src = torch.ones(64 << 20)
import sys
NT = int(sys.argv[1])
torch.set_num_threads(NT)
args = [(ctypes.c_void_p(p.data.data_ptr()), ctypes.c_long(p.data.shape[0]), ctypes.c_long(p.k // 2),
         ctypes.c_void_p(xh[p.k].data_ptr()), ctypes.c_void_p(outb.data_ptr()), ctypes.c_int(NT)) for p in packs]
def lib_run(xs):
    for p in packs: op(xs[p.k], p.data, p.n, None, 1, p.scale)
def bare_run():
    for a in args: lib.run8(*a)
def tiny_run():
    x = xs8[576]
    for _ in packs: op(x, tiny.data, tiny.n, None, 1, tiny.scale)
def ctypes_run():
    for a in args: lib.run8(a[0], ctypes.c_long(0), a[2], a[3], a[4], a[5])
res = collections.defaultdict(list)
for rnd in range(12):
    for name, fn in (("lib1", lambda: lib_run(xs1)), ("lib8", lambda: lib_run(xs8)), ("bare8", bare_run),
                     ("lib8 calls only (2-panel linear)", tiny_run), ("bare8 calls only (0 panels)", ctypes_run)):
        src.sum(); t0 = time.perf_counter(); fn(); res[name].append(time.perf_counter() - t0)
for k, v in res.items(): print(f"{k}: {statistics.median(v)*1e3:.3f} ms")
