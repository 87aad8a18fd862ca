# python kt_bits_ab.py: the keys-as-A-tiles scores (att_scores_amx_keys, kt_switch.patch in /tmp/kt) against
# the old (KT_OLD_DYN=1): bit-equal attention outputs on 200 random layouts
import os, sys, random, torch
sys.path.insert(0, "/work/main/tests")
from dflash_trt.plugins import invariant as inv
inv._SOURCE = "/tmp/kt/invariant.cpp"; inv.load()
from test_invariant import paged_layout, attn, _randn, _same
bi = inv
assert bi.set_isa("amx") == "amx"
rng = random.Random(0); n = 0
for trial in range(200):
    h, kvh, d = rng.choice([(9, 3, 64), (4, 2, 128), (8, 1, 64), (16, 4, 128)])
    lens = [rng.randint(1, 400) for _ in range(rng.randint(1, 4))]
    block = rng.choice([16, 16, 8, 32, 5])
    kc, vc, slots, offs = paged_layout(lens, kvh, d, seed=trial, dtype=torch.bfloat16, block=block)
    seqs, qn = [], 0
    for L in lens:
        ql = rng.randint(1, min(L, 20)); seqs.append((qn, ql, L)); qn += ql
    q = _randn(qn, h, d, seed=1000 + trial, dtype=torch.bfloat16) * rng.choice([0.1, 1, 8])
    causal = rng.random() < 0.8
    if not causal:
        seqs = [(a, b, max(c, b)) for a, b, c in seqs]
    os.environ.pop("KT_OLD_DYN", None); new = attn(q, kc, vc, seqs, slots, offs, d ** -0.5, causal=causal)
    os.environ["KT_OLD_DYN"] = "1"; old = attn(q, kc, vc, seqs, slots, offs, d ** -0.5, causal=causal)
    os.environ.pop("KT_OLD_DYN")
    assert _same(new, old), (trial, h, kvh, d, lens, block, seqs)
    n += 1
print("bit-equal in", n, "trials")
