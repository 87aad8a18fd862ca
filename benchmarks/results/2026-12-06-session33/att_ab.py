# python att_ab.py: one layer's paged attention of the embedded target (9 heads, 3 KV heads, D 64, bf16) over
# 16 sequences, AMX scores with the keys transposed (KT_OLD_DYN=1, the old kernel) and with the keys as the A
# tiles (the new), alternated in one process, outputs asserted bit-equal; ms per call (median)
# the scratch build: /tmp/kt/invariant.cpp = plugins/csrc/invariant.cpp with att_scores_amx_keys and a KT_OLD_DYN
# switch (kt_switch.patch) beside copies of plugins/csrc/*.h, *.cuh and invariant_layer.cpp
import os, sys, time, statistics, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
torch.set_num_threads(2)
from dflash_trt.plugins import invariant as inv
inv._SOURCE = "/tmp/kt/invariant.cpp"
inv.load()
from test_invariant import paged_layout, attn, _randn, _same
for ctx in (100, 200, 400, 1000):
    for rows in (1, 2, 8):
        lens = [ctx + 7 * i for i in range(16)]
        kc, vc, slots, offs = paged_layout(lens, 3, 64, seed=1, dtype=torch.bfloat16)
        seqs, qn = [], 0
        for L in lens:
            seqs.append((qn, rows, L)); qn += rows
        q = _randn(qn, 9, 64, seed=2, dtype=torch.bfloat16)
        ts = {"old": [], "new": []}
        for it in range(40):
            for m in ("old", "new"):
                if m == "old": os.environ["KT_OLD_DYN"] = "1"
                else: os.environ.pop("KT_OLD_DYN", None)
                t0 = time.perf_counter()
                o = attn(q, kc, vc, seqs, slots, offs, 0.125)
                ts[m].append(time.perf_counter() - t0)
                if it == 0:
                    if m == "old": ref = o
                    else: assert _same(o, ref)
        a, b = statistics.median(ts["old"]) * 1e3, statistics.median(ts["new"]) * 1e3
        print(f"ctx {ctx} rows {rows}: old {a:.3f} new {b:.3f} ms, new/old {b / a:.3f}", flush=True)
