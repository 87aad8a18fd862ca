# paged attention of SmolLM2's shape (H 9, KVH 3, D 64), 30 layers' caches, 1 or 8 query rows over ~300 keys, in
# bf16 and fp32; median ms per 30-layer pass, and a checksum of the outputs. python attab.py old|new|SRC
# "old": ac01d99's kernels, git show ac01d99:plugins/csrc/invariant.cpp > OLD/invariant.cpp (argmax_row.h beside
# it), run as `python attention_ab.py OLD/invariant.cpp`; "new" is this tree's. Run them alternately.
import sys, time, statistics, hashlib, torch
torch.set_num_threads(2)
import dflash_trt.plugins.invariant as inv
src = {"new": None}.get(sys.argv[1], sys.argv[1])
if src: inv._SOURCE = src
inv.load()
H, KVH, D, L, BS = 9, 3, 64, 300, 16
g = torch.Generator().manual_seed(0)
res = {}
for dt in (torch.bfloat16, torch.float32):
    nblk = (L + BS - 1) // BS
    kc = [torch.randn(nblk, BS, KVH, D, generator=g).to(dt) for _ in range(30)]
    vc = [torch.randn(nblk, BS, KVH, D, generator=g).to(dt) for _ in range(30)]
    for rows in (1, 8):
        q = torch.randn(rows, H, D, generator=g).to(dt)
        args = inv.attention_args([rows], [L], list(range(nblk)), BS)
        _, qs, ql, kl, ks, ko = args
        def run():
            return [inv.paged_attention(q, kc[i], vc[i], qs, ql, kl, ks, ko, D ** -0.5) for i in range(30)]
        ys = run()
        h = hashlib.sha1(b"".join(y.contiguous().view(torch.uint8).numpy().tobytes() for y in ys)).hexdigest()[:10]
        ts = []
        for _ in range(41):
            t0 = time.perf_counter(); run(); ts.append(time.perf_counter() - t0)
        res[(str(dt)[6:], rows)] = (statistics.median(ts) * 1e3, h)
for (dt, r), (t, h) in res.items():
    name = 'new' if sys.argv[1] == 'new' else 'old'
    print(f"{name} {dt:8s} rows {r} {t:7.3f} ms {h}")
