# bi_linear over 10 layers' worth of SmolLM2-shaped random weights (qkv, o, gate_up, down), per weight kind and
# row count: median ms per 40-linear pass, plus a checksum of every output (bits must match between builds).
# python linab.py old|new [kinds]
# "old" is 7482eee's kernels: git show 7482eee:plugins/csrc/invariant.cpp > /work/scratch/s26/inv_head/invariant.cpp
# (argmax_row.h beside it); "new" is this tree's; a path runs that file. Run old and new alternately.
import sys, time, statistics, hashlib, torch
torch.set_num_threads(2)
import dflash_trt.plugins.invariant as inv
src = {"old": "/work/scratch/s26/inv_head/invariant.cpp", "new": None}.get(sys.argv[1], sys.argv[1])
if src: inv._SOURCE = src
inv.load()
kinds = sys.argv[2].split(",") if len(sys.argv) > 2 else ["bf16p", "fp32", "fp8", "int8", "w8a8"]
ROWS = [1, 2, 4, 8, 12, 16, 32]
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 10
g = torch.Generator().manual_seed(0)
ws = [torch.randn(n, k, generator=g) * 0.05 for n, k in shapes]
def pack(kind, w):
    if kind == "bf16p": return inv.pack_linear_bf16_pairs(w)
    if kind == "fp32": return inv.pack_linear(w, torch.float32)
    if kind == "fp8": return inv.pack_linear_fp8((w / 0.01).to(torch.float8_e4m3fn), torch.tensor(0.01))
    if kind == "int8": return inv.pack_linear_int8(w)
    if kind == "w8a8": return inv.pack_linear_w8a8(w)
op = inv.binding("bi_linear")
out = {}
for kind in kinds:
    packs = [pack(kind, w) for w in ws]
    xdt = torch.bfloat16 if kind == "bf16p" else torch.float32
    for r in ROWS:
        xs = {k: torch.randn(r, k, generator=g).to(xdt) for k in (576, 1536)}
        def run():
            return [op(xs[p.k], p.data, p.n, None, 1, p.scale) for p in packs]
        ys = run()
        h = hashlib.sha1(b"".join(y.view(torch.uint8).numpy().tobytes() for y in ys)).hexdigest()[:10]
        ts = []
        for _ in range(9):
            t0 = time.perf_counter(); run(); ts.append(time.perf_counter() - t0)
        out[(kind, r)] = (statistics.median(ts) * 1e3, h)
    del packs
for (kind, r), (t, h) in out.items():
    print(f"{sys.argv[1]} {kind:6s} rows {r:3d} {t:8.3f} ms {h}")
