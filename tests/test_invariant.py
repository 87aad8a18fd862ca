"""Batch-invariant CPU kernels (plugins/invariant.py): bitwise row invariance, thread/ISA invariance, the
k-split tree for tensor parallelism, and closeness to the torch references."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

bi = pytest.importorskip("dflash_trt.plugins.invariant")


pytestmark = pytest.mark.usefixtures("invariant_kernels")


def _isas() -> list[str]:
    out = []
    for name in ("amx", "avx512", "avx2", "scalar"):
        if bi.set_isa(name) == name:  # a path this CPU lacks leaves another active
            out.append(name)
    bi.set_isa("auto")
    return out


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen(seed)).to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int16 if a.element_size() == 2
                                                                          else torch.int32),
                                                                   b.view(torch.int16 if b.element_size() == 2
                                                                          else torch.int32))


PAIRS = "bf16-pairs"  # bf16 k-pair panels: x rounded to bf16, bf16 x bf16 products (vdpbf16ps where present)


def _pack(w, kind):
    return bi.pack_linear_bf16_pairs(w) if kind == PAIRS else bi.pack_linear(w, kind)


def _as_packed(w, kind):
    """The weight and x rounding a packing computes with (pairs: bf16 weights, bf16 x)."""
    return w.to(torch.bfloat16 if kind in (torch.bfloat16, PAIRS) else torch.float32)


# ---- references -----------------------------------------------------------------------------------------------

def hf_rms_norm(x, w, eps):
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def paged_layout(lens: list[int], kvh: int, d: int, seed: int, dtype=torch.float32, block=16):
    """Random block tables over one cache; returns caches, flat slots (per sequence concatenated), offsets."""
    g = _gen(seed)
    nblocks = sum((n + block - 1) // block for n in lens) + 3
    perm = torch.randperm(nblocks, generator=g)
    slots, offs, used = [], [], 0
    for n in lens:
        nb = (n + block - 1) // block
        bt = perm[used:used + nb]
        used += nb
        offs.append(sum(len(s) for s in slots))
        slots.append((bt[:, None] * block + torch.arange(block)).flatten()[:n])
    s = nblocks * block
    kc = torch.randn(s, kvh, d, generator=g).to(dtype)
    vc = torch.randn(s, kvh, d, generator=g).to(dtype)
    return kc, vc, torch.cat(slots), torch.tensor(offs)


def attn(q, kc, vc, seqs, slots, offs, scale, causal=True):
    """seqs: list of (q_start, q_len, kv_len)."""
    qs = torch.tensor([s[0] for s in seqs], dtype=torch.int32)
    ql = torch.tensor([s[1] for s in seqs], dtype=torch.int32)
    kl = torch.tensor([s[2] for s in seqs], dtype=torch.int32)
    return bi.paged_attention(q, kc, vc, qs, ql, kl, slots, offs, scale, causal)


def sdpa_ref(q, kc, vc, seqs, slots, offs, scale, causal=True):
    out = torch.zeros(q.shape, dtype=torch.float32)
    for b, (q0, ql, kl) in enumerate(seqs):
        sl = slots[int(offs[b]):int(offs[b]) + kl]
        keys = kc[sl].float().transpose(0, 1)[None]
        vals = vc[sl].float().transpose(0, 1)[None]
        qq = q[q0:q0 + ql].float().transpose(0, 1)[None]
        mask = None
        if causal:
            mask = torch.arange(kl)[None, :] <= torch.arange(kl - ql, kl)[:, None]
        o = F.scaled_dot_product_attention(qq, keys, vals, attn_mask=mask, scale=scale, enable_gqa=True)
        out[q0:q0 + ql] = o[0].transpose(0, 1)
    return out


# ---- linear ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16, PAIRS])
def test_linear_rows_bitwise_invariant(wdtype):
    k, n = 576, 1536
    w = _randn(n, k, seed=1)
    b = _randn(n, seed=2)
    pk = _pack(w, wdtype)
    x = _randn(64, k, seed=3)
    full = bi.linear(x, pk, b)
    for m in range(1, 65):
        assert _same(bi.linear(x[:m], pk, b), full[:m]), m
    for start, m in [(5, 1), (13, 7), (30, 16), (47, 17), (63, 1), (1, 50)]:
        assert _same(bi.linear(x[start:start + m], pk, b), full[start:start + m]), (start, m)
    # one row at every position of a batch of unrelated rows
    row = x[7:8]
    alone = bi.linear(row, pk, b)
    others = _randn(24, k, seed=4)
    for pos in range(0, 25, 3):
        batch = torch.cat([others[:pos], row, others[pos:]])
        assert _same(bi.linear(batch, pk, b)[pos:pos + 1], alone), pos
    # a strided view of x gives the same rows
    wide = torch.cat([x, _randn(64, 8, seed=5)], dim=1)[:, :k]
    assert _same(bi.linear(wide, pk, b), full)


@pytest.mark.parametrize("k", [576, 584])  # 288 k-pairs, and 292: four past the last whole 16
def test_bf16_rows_on_pair_panels_bitwise_invariant(k):
    """A bf16 x on bf16 k-pair panels (a bf16 model's verify block: 8-row tiles read the rows as given): every
    row's bits are its own alone, at any batch size and position, on a strided view, and those of the same row
    given as fp32 (which the kernel rounds to bf16 itself)."""
    n = 200
    pk = bi.pack_linear_bf16_pairs(_randn(n, k, seed=70, dtype=torch.bfloat16))
    x = _randn(48, k, seed=71, dtype=torch.bfloat16)
    alone = torch.cat([bi.linear(x[i:i + 1], pk) for i in range(48)])
    for m in (2, 7, 8, 9, 16, 17, 48):
        assert _same(bi.linear(x[:m], pk), alone[:m]), m
    for start in (1, 13, 30):
        assert _same(bi.linear(x[start:start + 8], pk), alone[start:start + 8]), start
    wide = torch.cat([x, _randn(48, 6, seed=72, dtype=torch.bfloat16)], dim=1)[:, :k]
    assert _same(bi.linear(wide[:8], pk), alone[:8])
    assert _same(bi.linear(x[:8].float(), pk).to(torch.bfloat16), alone[:8])


@pytest.mark.parametrize("k,n,m", [(576, 1536, 5), (1536, 576, 3), (576, 49152, 1), (100, 1000, 9), (33, 5, 2),
                                   (576, 192, 33), (7, 64, 1)])
def test_linear_close_to_torch(k, n, m):
    w = _randn(n, k, seed=10)
    b = _randn(n, seed=11)
    x = _randn(m, k, seed=12)
    pk = bi.pack_linear(w)
    ref = F.linear(x.double(), w.double(), b.double()).float()
    tol = 4e-6 * math.sqrt(k) * 4
    torch.testing.assert_close(bi.linear(x, pk, b), ref, rtol=1e-5, atol=tol)
    torch.testing.assert_close(bi.linear(x, pk), ref - b, rtol=1e-5, atol=tol)
    if n > 10000:  # the lm_head shape: one row alone and inside a batch
        x5 = torch.cat([x, _randn(4, k, seed=13)])
        assert _same(bi.linear(x5, pk)[:1], bi.linear(x, pk))


def test_linear_bf16():
    k, n = 576, 1536
    w = _randn(n, k, seed=20, dtype=torch.bfloat16)
    pk = bi.pack_linear(w)
    assert pk.dtype == torch.bfloat16 and pk.nbytes() == n * k * 2
    x = _randn(8, k, seed=21)
    ref = F.linear(x.double(), w.double()).float()
    torch.testing.assert_close(bi.linear(x, pk), ref, rtol=1e-5, atol=1e-4)
    # bf16 activations: fp32 accumulation, one rounding at the end
    xb = x.to(torch.bfloat16)
    y = bi.linear(xb, pk, _randn(n, seed=22, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16
    yref = (F.linear(xb.double(), w.double()) + _randn(n, seed=22, dtype=torch.bfloat16).double()).to(torch.bfloat16)
    torch.testing.assert_close(y.float(), yref.float(), rtol=1e-2, atol=1e-2)
    for m in (1, 3, 8):
        assert _same(bi.linear(xb[:m], pk), bi.linear(xb, pk)[:m])
    # bf16 packing of a float32 weight == fp32 packing of the bf16-rounded weight (exact widening)
    w32 = _randn(n, k, seed=23)
    assert _same(bi.linear(x, bi.pack_linear(w32, torch.bfloat16)),
                 bi.linear(x, bi.pack_linear(w32.to(torch.bfloat16).float())))
    # leading dims
    x3 = x.view(2, 4, k)
    assert _same(bi.linear(x3, pk).view(8, n), bi.linear(x, pk))


@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16, PAIRS])
def test_k_splits_partial_tree_sum(wdtype):
    k, n = 576, 1536
    w = _randn(n, k, seed=30)
    b = _randn(n, seed=31)
    x = _randn(11, k, seed=32)
    pk = _pack(w, wdtype)
    xr = x.to(torch.bfloat16) if wdtype == PAIRS else x
    ref = F.linear(xr.double(), _as_packed(w, wdtype).double(), b.double()).float()
    for ks in (1, 2, 4, 8):
        y = bi.linear(x, pk, b, k_splits=ks)
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)
        for m in (1, 2, 5):
            assert _same(bi.linear(x[:m], pk, b, k_splits=ks), y[:m])
        for tp in (t for t in (1, 2, 4, 8) if ks % t == 0):
            per = ks // tp
            parts = [bi.linear_partial(x, pk, r * per, (r + 1) * per, ks) for r in range(tp)]
            assert all(p.dtype == torch.float32 for p in parts)
            assert _same(bi.tree_sum(parts, b, x.dtype), y), (ks, tp)
            # a TP rank that only holds its K slice of x and of the weight
            ck = k // tp
            slices = [bi.linear_partial(x[:, r * ck:(r + 1) * ck],
                                        _pack(w[:, r * ck:(r + 1) * ck], wdtype), 0, per, per)
                      for r in range(tp)]
            assert _same(bi.tree_sum(slices, b, x.dtype), y), (ks, tp)
            # x holding only the chunks' columns, full packed weight
            xs = [bi.linear_partial(x[:, r * ck:(r + 1) * ck], pk, r * per, (r + 1) * per, ks) for r in range(tp)]
            assert _same(bi.tree_sum(xs, b, x.dtype), y)
            # and a rank's own partial equals the linear of its slice with k_splits // tp
            s0 = bi.linear(x[:, :ck], _pack(w[:, :ck], wdtype), k_splits=per)
            assert _same(s0, parts[0])
    # bf16 activations through the tree as well
    xb = x.to(torch.bfloat16)
    yb = bi.linear(xb, pk, b, k_splits=4)
    parts = [bi.linear_partial(xb, pk, 2 * r, 2 * r + 2, 4) for r in range(2)]
    assert _same(bi.tree_sum(parts, b, torch.bfloat16), yb)
    with pytest.raises(RuntimeError):
        bi.linear(x[:, :575], bi.pack_linear(w[:, :575]), k_splits=2)
    with pytest.raises(RuntimeError):
        bi.linear_partial(x, pk, 1, 3, 4)  # not aligned


def test_linear_bf16_pairs():
    """bf16 k-pair panels: y = bf16(x) @ W with exact products, close to a float64 reference; bf16 x rounds
    nothing more; the format's limits fail with a clear message."""
    k, n = 576, 1000
    w = _randn(n, k, seed=24, dtype=torch.bfloat16)
    pk = bi.pack_linear_bf16_pairs(w)
    assert pk.dtype == torch.int16 and pk.nbytes() == 32 * 32 * k * 2 and pk.n == n
    x = _randn(9, k, seed=25)
    ref = F.linear(x.to(torch.bfloat16).double(), w.double()).float()
    torch.testing.assert_close(bi.linear(x, pk), ref, rtol=1e-5, atol=1e-4)
    assert _same(bi.linear(x.to(torch.bfloat16), pk), bi.linear(x, pk).to(torch.bfloat16))
    # the same products as the fp32 kernel on the rounded operands, in another order: close, not equal
    yf = bi.linear(x.to(torch.bfloat16).float(), bi.pack_linear(w.float()))
    torch.testing.assert_close(bi.linear(x, pk), yf, rtol=1e-5, atol=1e-4)
    with pytest.raises(AssertionError, match="even K"):
        bi.pack_linear_bf16_pairs(w[:, :575])
    torch.testing.assert_close(bi.linear(x[:, :36], bi.pack_linear_bf16_pairs(w[:, :36]), k_splits=2),
                               F.linear(x[:, :36].to(torch.bfloat16).double(), w[:, :36].double()).float(),
                               rtol=1e-5, atol=1e-4)  # chunks of 18
    with pytest.raises(RuntimeError, match="even number of columns"):
        bi.linear(x[:, :36], bi.pack_linear_bf16_pairs(w[:, :36]), k_splits=4)  # chunks of 9 are not


def test_linear_odd_k_and_n():
    k, n = 101, 77
    w = _randn(n, k, seed=40)
    x = _randn(19, k, seed=41)
    pk = bi.pack_linear(w)
    torch.testing.assert_close(bi.linear(x, pk), F.linear(x.double(), w.double()).float(), rtol=1e-5, atol=1e-4)
    full = bi.linear(x, pk)
    for m in range(1, 20):
        assert _same(bi.linear(x[m - 1:m], pk), full[m - 1:m])


# ---- threads and ISAs ---------------------------------------------------------------------------------------------

def _everything(seed=50):
    """One call of every kernel on shapes that hit tails; returns the outputs."""
    k, n = 576, 1536
    w = _randn(n, k, seed=seed)
    b = _randn(n, seed=seed + 1)
    x = _randn(37, k, seed=seed + 2)
    out = []
    for wd in (torch.float32, torch.bfloat16, PAIRS):
        pk = _pack(w, wd)
        out += [bi.linear(x, pk, b), bi.linear(x[:1], pk), bi.linear(x, pk, k_splits=8),
                bi.linear_partial(x, pk, 2, 4, 4), bi.linear(x.to(torch.bfloat16), pk, b)]
    p8 = bi.pack_linear_int8(w)  # int8 panels: the codes widened and scaled in registers
    out += [bi.linear(x, p8, b), bi.linear(x[:1], p8), bi.linear(x, p8, k_splits=8), bi.linear_partial(x, p8, 2, 4, 4),
            bi.linear(x.to(torch.bfloat16), p8, b)]
    out.append(bi.linear(_randn(5, 101, seed=seed + 3), bi.pack_linear_int8(_randn(77, 101, seed=seed + 4))))
    out.append(bi.linear(_randn(5, 101, seed=seed + 3), bi.pack_linear(_randn(77, 101, seed=seed + 4))))
    out.append(bi.linear(_randn(5, 101, seed=seed + 3, dtype=torch.bfloat16),
                         bi.pack_linear(_randn(77, 101, seed=seed + 4), torch.bfloat16), _randn(77, seed=seed + 5)))
    h = _randn(33, 576, seed=seed + 5)
    hw = _randn(576, seed=seed + 6)
    out += [bi.rms_norm(h, hw, 1e-5), bi.rms_norm(h.to(torch.bfloat16), hw.to(torch.bfloat16), 1e-6),
            bi.rms_norm(h[:, :100], hw[:100], 1e-5)]
    out += list(bi.add_rms_norm(h, _randn(33, 576, seed=seed + 7), hw, 1e-5))
    g, u = _randn(9, 1539, seed=seed + 8) * 4, _randn(9, 1539, seed=seed + 9)
    out += [bi.silu_mul(g, u), bi.silu_mul(g.to(torch.bfloat16), u.to(torch.bfloat16))]
    # one panel of columns: threads split the rows instead
    out.append(bi.linear(_randn(37, 576, seed=seed + 16), bi.pack_linear(_randn(20, 576, seed=seed + 17)),
                         k_splits=2))
    kc, vc, slots, offs = paged_layout([40, 300, 17], 3, 64, seed + 10)
    q = _randn(1 + 16 + 17, 9, 64, seed=seed + 11)
    seqs = [(0, 1, 40), (1, 16, 300), (17, 17, 17)]
    out += [attn(q, kc, vc, seqs, slots, offs, 0.125), attn(q, kc, vc, seqs, slots, offs, 0.125, causal=False)]
    kc2, vc2, slots2, offs2 = paged_layout([50], 2, 72, seed + 12, torch.bfloat16)
    out.append(attn(_randn(5, 4, 72, seed=seed + 13), kc2, vc2, [(0, 5, 50)], slots2, offs2, 72 ** -0.5))
    kc3, vc3, slots3, offs3 = paged_layout([33], 1, 32, seed + 14)
    out.append(attn(_randn(17, 2, 32, seed=seed + 15), kc3, vc3, [(0, 17, 33)], slots3, offs3, 32 ** -0.5))
    return out


def test_thread_count_invariance():
    torch.set_num_threads(1)
    one = _everything()
    torch.set_num_threads(2)
    two = _everything()
    for i, (a, b) in enumerate(zip(one, two)):
        assert _same(a, b), i
    # more threads than cores still only splits tiles
    torch.set_num_threads(3)
    three = _everything()
    for i, (a, b) in enumerate(zip(one, three)):
        assert _same(a, b), i
    torch.set_num_threads(2)


def test_flush_denormal_reaches_worker_threads():
    """torch.set_flush_denormal only sets the calling thread's MXCSR; workers must compute like it."""
    k, n = 64, 4096
    w = _randn(n, k, seed=55) * 1e-20
    x = _randn(4, k, seed=56) * 1e-21  # products ~1e-41: denormal
    pk = bi.pack_linear(w)
    if not torch.set_flush_denormal(True):
        pytest.skip("no flush-denormal on this CPU")
    try:
        torch.set_num_threads(1)
        one = bi.linear(x, pk)
        torch.set_num_threads(2)
        two = bi.linear(x, pk)
    finally:
        torch.set_flush_denormal(False)
    assert _same(one, two)
    assert torch.count_nonzero(one) == 0  # flushed
    assert torch.count_nonzero(bi.linear(x, pk)) > 0  # and kept without flushing


_PAIR_OUTPUTS = range(10, 15)  # _everything's bf16 k-pair linears


def _amx_tiles_pairs() -> bool:
    """Whether the amx path runs bf16 k-pair panels on AMX-BF16 tiles (bits of its own)."""
    return "amx_bf16" in bi._cpu_flags() and "amx" in _isas()


def test_isa_paths_bitwise_equal():
    """Every path gives the same bits, but for bf16 k-pairs on AMX-BF16 tiles: tdpbf16ps rounds its sums in an
    order no other path reproduces, so those are only close (their row invariance: the tests above and
    test_amx_bf16_pairs_rows_and_tails, which run on the active path)."""
    isas = _isas()
    if len(isas) < 2:
        pytest.skip("only one code path on this CPU")
    results = {}
    for name in isas:
        assert bi.set_isa(name) == name
        results[name] = _everything(seed=60)
    bi.set_isa("auto")
    ref = next(n for n in isas if n != "amx")
    tiles = _amx_tiles_pairs()
    for name in isas:
        for i, (a, b) in enumerate(zip(results[ref], results[name])):
            if name == "amx" and i in _PAIR_OUTPUTS and tiles:
                tol = dict(rtol=1e-5, atol=1e-4) if a.dtype == torch.float32 else dict(rtol=8e-3, atol=1e-2)
                torch.testing.assert_close(b, a, **tol)
                assert not _same(a, b), i  # the tiles did run: their bits are not the chains'
            else:
                assert _same(a, b), (name, i)


@pytest.mark.parametrize("k, splits", [(576, 1), (584, 1), (584, 2), (36, 2), (1536, 8)])
def test_amx_bf16_pairs_rows_and_tails(k, splits):
    """bf16 k-pairs on AMX-BF16 tiles: close to a float64 reference with whole 16-pair steps, a chunk's last pairs
    after them (584: four past the last 16; 36 in two chunks of 9 pairs: none on tiles) and chunk trees; every
    row's bits its own alone in blocks of 1 to 16 rows and in two block sizes at once (17, 33 rows), fp32 or bf16
    x."""
    if not _amx_tiles_pairs():
        pytest.skip("no AMX-BF16 tiles on this CPU")
    assert bi.set_isa("amx") == "amx"
    n = 70
    w = _randn(n, k, seed=90, dtype=torch.bfloat16)
    pk = bi.pack_linear_bf16_pairs(w)
    x = _randn(40, k, seed=91)
    b = _randn(n, seed=92)
    ref = (F.linear(x.to(torch.bfloat16).double(), w.double()) + b.double()).float()
    full = bi.linear(x, pk, b, splits)
    torch.testing.assert_close(full, ref, rtol=1e-5, atol=1e-4)
    alone = torch.cat([bi.linear(x[i:i + 1], pk, b, splits) for i in range(40)])
    for m in (2, 8, 13, 16, 17, 33, 40):
        assert _same(bi.linear(x[:m], pk, b, splits), alone[:m]), m
    assert _same(bi.linear(x[5:22].to(torch.bfloat16), pk, b, splits), alone[5:22].to(torch.bfloat16))


def test_horizontal_tree():
    a = _randn(16, 16, seed=70)
    r8 = a[:, :8] + a[:, 8:]
    r4 = r8[:, :4] + r8[:, 4:]
    r2 = r4[:, :2] + r4[:, 2:]
    ref = r2[:, 0] + r2[:, 1]
    for name in _isas():
        bi.set_isa(name)
        assert _same(torch.ops.dflash_trt.bi_selftest_reduce(a.flatten()), ref), name
    bi.set_isa("auto")


# ---- rms norm / silu ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("h", [576, 100, 7])
def test_rms_norm(h):
    x = _randn(64, h, seed=80) * 3
    w = _randn(h, seed=81)
    y = bi.rms_norm(x, w, 1e-5)
    torch.testing.assert_close(y, hf_rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-5)
    for m in range(1, 65, 7):
        assert _same(bi.rms_norm(x[m - 1:m + 3], w, 1e-5), y[m - 1:m + 3])
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    yb = bi.rms_norm(xb, wb, 1e-6)
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb.float(), hf_rms_norm(xb, wb, 1e-6).float(), rtol=1.6e-2, atol=1e-2)
    # fp32 weight with bf16 activations: promoted output like HF
    torch.testing.assert_close(bi.rms_norm(xb, w, 1e-6), hf_rms_norm(xb, w, 1e-6), rtol=1e-2, atol=1e-2)
    # 3-d input
    assert _same(bi.rms_norm(x.view(8, 8, h), w, 1e-5).view(64, h), y)


def test_add_rms_norm():
    x, r = _randn(20, 576, seed=90), _randn(20, 576, seed=91)
    w = _randn(576, seed=92)
    y, s = bi.add_rms_norm(x, r, w, 1e-5)
    assert _same(s, x + r)
    assert _same(y, bi.rms_norm(x + r, w, 1e-5))
    xb, rb, wb = x.to(torch.bfloat16), r.to(torch.bfloat16), w.to(torch.bfloat16)
    y, s = bi.add_rms_norm(xb, rb, wb, 1e-5)
    assert _same(s, xb + rb)
    assert _same(y, bi.rms_norm(xb + rb, wb, 1e-5))
    assert _same(bi.add_rms_norm(x[3:4], r[3:4], w, 1e-5)[0], bi.add_rms_norm(x, r, w, 1e-5)[0][3:4])


def test_silu_mul():
    g, u = _randn(12, 1539, seed=100) * 5, _randn(12, 1539, seed=101)
    y = bi.silu_mul(g, u)
    torch.testing.assert_close(y, F.silu(g) * u, rtol=1e-5, atol=1e-6)
    # every element takes the same path: tails at any column give the same bits
    for c in (1, 15, 16, 17, 100, 1538):
        assert _same(bi.silu_mul(g[:, :c].contiguous(), u[:, :c].contiguous()), y[:, :c]), c
        assert _same(bi.silu_mul(g[:, -c:].contiguous(), u[:, -c:].contiguous()), y[:, -c:]), c
    assert _same(bi.silu_mul(g[4:5], u[4:5]), y[4:5])
    # halves of a fused gate_up output (strided views)
    gu = torch.cat([g, u], dim=1)
    assert _same(bi.silu_mul(gu[:, :1539], gu[:, 1539:]), y)
    gb, ub = g.to(torch.bfloat16), u.to(torch.bfloat16)
    torch.testing.assert_close(bi.silu_mul(gb, ub).float(), (F.silu(gb) * ub).float(), rtol=1.6e-2, atol=1e-2)
    # extremes stay finite and signed like torch
    ex = torch.tensor([[-200.0, -90.0, -1e-30, 0.0, 1e-30, 90.0, 200.0]])
    torch.testing.assert_close(bi.silu_mul(ex, torch.ones_like(ex)), F.silu(ex), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("kind", ["fp32", "bf16", "bf16_pairs", "w8a8"])
def test_linear_silu_is_the_linear_then_silu_mul(kind):
    """A fused gate|up projection and its SiLU in one op (each thread computes the gate and the up panels of the
    same columns, then their SiLU * up) gives exactly linear() then silu_mul() on the output's halves: at one and
    two threads, at every row count, with an intermediate size that is no whole number of panels."""
    from dflash_trt.plugins import layer

    k, inter = 576, 200
    pack = {"fp32": bi.pack_linear, "bf16": lambda w: bi.pack_linear(w, torch.bfloat16),
            "bf16_pairs": bi.pack_linear_bf16_pairs, "w8a8": bi.pack_linear_w8a8}[kind]
    cat = layer.concat_packed([pack(_randn(inter, k, seed=110)), pack(_randn(inter, k, seed=111))])
    up = cat.cols[1]
    bias = layer.concat_bias([_randn(inter, seed=112), _randn(inter, seed=113)], [inter, inter], cat.cols,
                             cat.packed.n)
    dtype = torch.float32 if kind == "fp32" else torch.bfloat16
    threads = torch.get_num_threads()
    try:
        for th in (1, 2):
            torch.set_num_threads(th)
            for m in (1, 3, 8, 17):
                x = _randn(m, k, seed=114 + m, dtype=dtype)
                for b in (None, bias):
                    y = bi.linear(x, cat.packed, b)
                    ref = bi.silu_mul(y[:, :inter], y[:, up:up + inter])
                    assert _same(bi.linear_silu(x, cat.packed, inter, up, b), ref), (th, m, b is None)
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(RuntimeError, match="panel boundary"):
        bi.linear_silu(x, cat.packed, inter, up - 8)


@pytest.mark.parametrize("kind", ["fp32", "bf16", "bf16_pairs", "w8a8"])
def test_norm_linear_is_the_norm_then_the_linear(kind):
    """rms_norm (with a residual add or without) and then a linear, or a gate|up linear and its SiLU, in one op
    whose threads each norm every row themselves: exactly rms_norm / add_rms_norm, then linear / linear_silu, and
    x + residual whole, at one and two threads and every row count."""
    from dflash_trt.plugins import layer

    k, inter = 576, 200
    pack = {"fp32": bi.pack_linear, "bf16": lambda w: bi.pack_linear(w, torch.bfloat16),
            "bf16_pairs": bi.pack_linear_bf16_pairs, "w8a8": bi.pack_linear_w8a8}[kind]
    plain = pack(_randn(96, k, seed=130))
    cat = layer.concat_packed([pack(_randn(inter, k, seed=131)), pack(_randn(inter, k, seed=132))])
    up = cat.cols[1]
    bias = _randn(96, seed=133)
    dtype = torch.float32 if kind == "fp32" else torch.bfloat16
    w = (1 + 0.1 * _randn(k, seed=134)).to(dtype)
    threads = torch.get_num_threads()
    try:
        for th in (1, 2):
            torch.set_num_threads(th)
            for m in (1, 3, 8, 17):
                x, r = _randn(m, k, seed=135 + m, dtype=dtype), _randn(m, k, seed=155 + m, dtype=dtype)
                h = bi.rms_norm(x, w, 1e-5)
                y, none = bi.norm_linear(x, w, 1e-5, plain, bias)
                assert none is None and _same(y, bi.linear(h, plain, bias)), (th, m)
                h2, s = bi.add_rms_norm(x, r, w, 1e-5)
                act, x1 = bi.norm_linear(x, w, 1e-5, cat.packed, residual=r, inter=inter, up_col=up)
                assert _same(x1, s), (th, m)
                assert _same(act, bi.linear_silu(h2, cat.packed, inter, up)), (th, m)
                if dtype == torch.bfloat16:  # an fp32 norm weight: the norm's output, and so the linear's, fp32
                    y32, _ = bi.norm_linear(x, w.float(), 1e-5, plain, bias)
                    assert y32.dtype == torch.float32
                    assert _same(y32, bi.linear(bi.rms_norm(x, w.float(), 1e-5), plain, bias)), (th, m)
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(RuntimeError, match="panel boundary"):
        bi.norm_linear(x, w, 1e-5, cat.packed, inter=inter, up_col=up - 8)


# ---- attention --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("h,kvh,d", [(9, 3, 64), (4, 2, 128), (4, 4, 72)])
def test_attention_close_to_sdpa(h, kvh, d):
    lens = [(1, 37), (16, 300), (40, 40), (5, 1025)]
    kc, vc, slots, offs = paged_layout([kl for _, kl in lens], kvh, d, seed=110)
    seqs, t = [], 0
    for ql, kl in lens:
        seqs.append((t, ql, kl))
        t += ql
    q = _randn(t, h, d, seed=111)
    scale = d ** -0.5
    for causal in (True, False):
        out = attn(q, kc, vc, seqs, slots, offs, scale, causal)
        torch.testing.assert_close(out, sdpa_ref(q, kc, vc, seqs, slots, offs, scale, causal), rtol=1e-5,
                                   atol=2e-6)
    # bf16 caches and queries
    kb, vb, qb = kc.to(torch.bfloat16), vc.to(torch.bfloat16), q.to(torch.bfloat16)
    out = attn(qb, kb, vb, seqs, slots, offs, scale)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), sdpa_ref(qb, kb, vb, seqs, slots, offs, scale).float(), rtol=1e-2,
                               atol=1e-2)
    # [blocks, block_size, KVH, D] caches are accepted as they are
    out4 = attn(q, kc.view(-1, 16, kvh, d), vc.view(-1, 16, kvh, d), seqs, slots, offs, scale)
    assert _same(out4, attn(q, kc, vc, seqs, slots, offs, scale))


@pytest.mark.parametrize("h,kvh,d,dtype", [(9, 3, 64, torch.float32), (4, 2, 128, torch.float32),
                                            (9, 3, 64, torch.bfloat16), (4, 2, 128, torch.bfloat16)])
def test_attention_row_invariance(h, kvh, d, dtype):
    """One query row: alone (decode), inside its prefill chunk, inside a 16-row verify block, and packed with
    other sequences, all bitwise equal; bf16 takes the k-pair scores and the key-pair PV, whose pairs run past a
    row's last key (and, at an odd count, past the sequence's: the cache slots no sequence holds are NaN here)."""
    L = 333
    kc, vc, slots, offs = paged_layout([L, 90, 200], kvh, d, seed=120, dtype=dtype)
    unused = torch.ones(kc.shape[0], dtype=torch.bool)
    unused[slots] = False
    kc[unused], vc[unused] = float("nan"), float("nan")
    qall = _randn(L, h, d, seed=121, dtype=dtype)  # the query of every position of sequence 0
    scale = d ** -0.5
    # whole sequence as one prefill chunk
    prefill = attn(qall, kc, vc, [(0, L, L)], slots, offs[:1], scale)
    assert bool(prefill.isfinite().all())
    # a prefill chunk of the last 100 rows
    chunk = attn(qall[L - 100:], kc, vc, [(0, 100, L)], slots, offs[:1], scale)
    assert _same(chunk, prefill[L - 100:])
    for pos in (0, 1, 15, 16, 17, 200, L - 16, L - 1):
        alone = attn(qall[pos:pos + 1], kc, vc, [(0, 1, pos + 1)], slots, offs[:1], scale)
        assert _same(alone, prefill[pos:pos + 1]), pos
    # verify blocks of 16 rows ending at several lengths
    for end in (16, 17, 100, L):
        blk = attn(qall[end - 16:end], kc, vc, [(0, 16, end)], slots, offs[:1], scale)
        assert _same(blk, prefill[end - 16:end]), end
    # packed with other sequences (other sequence first, ours second, another after)
    other_q = _randn(7 + 12, h, d, seed=122, dtype=dtype)
    q = torch.cat([other_q[:7], qall[L - 16:], other_q[7:]])
    seqs = [(0, 7, 90), (7, 16, L), (23, 12, 200)]
    offs3 = torch.tensor([int(offs[1]), 0, int(offs[2])])
    out = attn(q, kc, vc, seqs, slots, offs3, scale)
    assert _same(out[7:23], prefill[L - 16:])
    # rows of the other sequences equal their own solo computation
    solo = attn(other_q[:7], kc, vc, [(0, 7, 90)], slots, offs[1:2], scale)
    assert _same(out[:7], solo)


@pytest.mark.parametrize("h,kvh,d", [(9, 3, 64), (4, 2, 128)])
def test_amx_bf16_attention_rows_and_tails(h, kvh, d):
    """A bf16 model's scores and PV on AMX-BF16 tiles: within bf16 rounding of SDPA; every query's bits its own
    alone, in verify blocks of 2-16 rows ending either side of the 32-key steps, in a prefill chunk and as a
    drafter's non-causal block (the cache slots no sequence holds are NaN: nothing past a sequence's last key
    is read); and not the vdpbf16ps chains' bits (the tiles ran)."""
    if not _amx_tiles_pairs():
        pytest.skip("no AMX-BF16 tiles on this CPU")
    L = 301
    kc, vc, slots, offs = paged_layout([L, 45], kvh, d, seed=125, dtype=torch.bfloat16)
    unused = torch.ones(kc.shape[0], dtype=torch.bool)
    unused[slots] = False
    kc[unused], vc[unused] = float("nan"), float("nan")
    qall = _randn(L, h, d, seed=126, dtype=torch.bfloat16)
    scale = d ** -0.5
    assert bi.set_isa("amx") == "amx"
    try:
        prefill = attn(qall, kc, vc, [(0, L, L)], slots, offs[:1], scale)
        ref = sdpa_ref(qall, kc, vc, [(0, L, L)], slots, offs[:1], scale)
        torch.testing.assert_close(prefill.float(), ref, rtol=1e-2, atol=1e-2)
        for pos in (0, 1, 30, 31, 32, 33, 63, 64, 200, L - 1):
            assert _same(attn(qall[pos:pos + 1], kc, vc, [(0, 1, pos + 1)], slots, offs[:1], scale),
                         prefill[pos:pos + 1]), pos
        for rows, end in ((2, 33), (8, 32), (8, 40), (8, 64), (8, 65), (13, 100), (16, L)):
            blk = attn(qall[end - rows:end], kc, vc, [(0, rows, end)], slots, offs[:1], scale)
            assert _same(blk, prefill[end - rows:end]), (rows, end)
        # a drafter's block: every row sees all 45 keys of the second sequence, alone or 16 at once
        qd = _randn(16, h, d, seed=127, dtype=torch.bfloat16)
        block = attn(qd, kc, vc, [(0, 16, 45)], slots, offs[1:], scale, causal=False)
        for i in (0, 7, 15):
            assert _same(attn(qd[i:i + 1], kc, vc, [(0, 1, 45)], slots, offs[1:], scale, causal=False),
                         block[i:i + 1]), i
        assert bi.set_isa("avx512") == "avx512"
        chains = attn(qall, kc, vc, [(0, L, L)], slots, offs[:1], scale)
    finally:
        bi.set_isa("auto")
    torch.testing.assert_close(prefill.float(), chains.float(), rtol=1e-2, atol=1e-2)
    assert not _same(prefill, chains)


def test_attention_edge_cases():
    kc, vc, slots, offs = paged_layout([20], 1, 64, seed=130)
    q = _randn(3, 2, 64, seed=131)
    # a row that belongs to no sequence is 0, after the sequences or before them
    out = attn(q, kc, vc, [(0, 2, 20)], slots, offs, 0.1)
    assert torch.count_nonzero(out[2]) == 0
    for _ in range(3):  # outputs of rows the sequences tile are written, not zeroed first: reuse dirty memory
        attn(_randn(3, 2, 64, seed=132) * 1e3, kc, vc, [(0, 3, 20)], slots, offs, 0.1)
        out = attn(q, kc, vc, [(1, 2, 20)], slots, offs, 0.1)
        assert torch.count_nonzero(out[0]) == 0 and torch.count_nonzero(out[1:]) == out[1:].numel()
    # one key: output is that value row
    out = attn(q[:1], kc, vc, [(0, 1, 1)], slots, offs, 0.1)
    assert torch.allclose(out[0], vc[slots[0]].expand(2, 64), atol=1e-6)
    with pytest.raises(RuntimeError):
        attn(q, kc, vc, [(0, 3, 2)], slots, offs, 0.1)  # q_len > kv_len


def test_attention_reads_bf16_queries_as_their_exact_fp32_values():
    """A bf16 model's queries go to the kernel as they are (each widened as it is loaded): where the scores do not
    come from k-pairs (D of 32 here), the result is bit for bit that of the same queries widened first, rounded
    to bf16 once at the end."""
    kc, vc, slots, offs = paged_layout([40, 9], 3, 32, seed=140, dtype=torch.bfloat16)
    q = _randn(7, 6, 32, seed=141, dtype=torch.bfloat16)
    seqs = [(0, 4, 40), (4, 3, 9)]
    assert _same(attn(q, kc, vc, seqs, slots, offs, 0.125), attn(q.float(), kc, vc, seqs, slots, offs,
                                                                  0.125).to(torch.bfloat16))


@pytest.mark.parametrize("kind,xdtype", [(torch.float32, torch.float32), (PAIRS, torch.bfloat16),
                                         ("w8a8", torch.bfloat16)])
def test_head_argmax_is_torch_argmax_of_the_heads_logits(kind, xdtype):
    """head_argmax: each row's torch.argmax of linear(x, head) (ties: the first index; a NaN wins), mapped
    through the token ids, and with confidence the softmax probability of the maximum; every ISA path gives the
    same tokens and the same confidence bits."""
    n, k = 1000 + 37, 64  # a tail past the 16-lane blocks
    w = _randn(n, k, seed=150)
    packed = bi.pack_linear_w8a8(w) if kind == "w8a8" else _pack(w, kind)
    x = _randn(6, k, seed=151, dtype=xdtype)
    x[1] = 0  # every logit 0: a tie over the whole row, won by index 0
    ids = torch.randperm(n, generator=_gen(152)) + 5
    logits = bi.linear(x, packed).float()
    results = {}
    for name in _isas():
        bi.set_isa(name)
        results[name] = bi.head_argmax(x, packed, ids, confidence=True)
    bi.set_isa("auto")
    toks, conf = next(iter(results.values()))
    assert torch.equal(toks, ids[logits.argmax(-1)])
    p = torch.softmax(logits.double(), -1).max(-1).values
    assert torch.allclose(conf.double(), p, rtol=1e-5, atol=0)
    for t2, c2 in results.values():
        assert torch.equal(t2, toks) and _same(c2, conf)
    plain, none = bi.head_argmax(x, packed)
    assert torch.equal(plain, logits.argmax(-1)) and none is None
    # ties, the tail lanes and NaN, on the argmax pass alone: an identity head gives x back as the logits, and
    # NaN head rows give every row NaN logits in their columns
    eye = torch.eye(64)
    y = torch.randn(3, 64, generator=_gen(153))
    y[0, 12] = y[0, 9] = y[0].abs().max() + 1  # tie within one 16-lane block: index 9
    y[1, 63] = 1e30  # the maximum in the last lanes
    y[2] = -float("inf")
    nan_eye = eye.clone()
    nan_eye[50], nan_eye[20] = float("nan"), float("nan")
    for name in _isas():
        bi.set_isa(name)
        got, c = bi.head_argmax(y, _pack(eye, torch.float32), confidence=True)
        assert got.tolist() == [9, 63, 0] and c[1] == 1.0, name
        got, c = bi.head_argmax(y[:2], _pack(nan_eye, torch.float32), confidence=True)
        assert got.tolist() == [20, 20] and bool(c.isnan().all()), name
    bi.set_isa("auto")


@pytest.mark.parametrize("d", [32, 64, 128, 256])
def test_bf16_scores_from_k_pairs_on_every_isa(d):
    """A bf16 model's scores (bf16 queries and K/V, D of 64-512) come from k-pairs, the odd dim's product
    then the even one's per lane (vdpbf16ps where the CPU has it, two fmas elsewhere): every ISA path gives the
    same bits, but for AMX-BF16 tiles (bits of their own: test_amx_bf16_attention_rows_and_tails), and the result
    stays within rounding of SDPA (a D of 32 keeps the widened chain, on tiles too)."""
    kc, vc, slots, offs = paged_layout([70, 33], 3, d, seed=160, dtype=torch.bfloat16)
    q = _randn(9, 6, d, seed=161, dtype=torch.bfloat16)
    seqs = [(0, 5, 70), (5, 4, 33)]
    results = {}
    for name in _isas():
        bi.set_isa(name)
        results[name] = attn(q, kc, vc, seqs, slots, offs, d ** -0.5)
    bi.set_isa("auto")
    tiles = _amx_tiles_pairs() and d % 64 == 0
    base = next(r for name, r in results.items() if name != "amx" or not tiles)
    ref = sdpa_ref(q.float(), kc.float(), vc.float(), seqs, slots, offs, d ** -0.5)
    for name, r in results.items():
        assert (r.float() - ref).abs().max() < 2e-2, name
        assert _same(r, base) != (name == "amx" and tiles), name


def test_bf16_attention_chains_add_the_odd_term_first():
    """A bf16 model's score adds each dim pair's odd product, then the even one (vdpbf16ps' order), and its PV each
    key pair's odd key, then the even one: on every ISA path but AMX-BF16 tiles. Values built so that the other
    order rounds to a different result: 1 + 2^24 rounds to 2^24 (a tie, to even), so adding +2^24 before -2^24
    cancels the 1 and adding -2^24 first keeps it."""
    d, big = 64, 2.0 ** 12
    kc = torch.zeros(16, 1, d)
    vc = torch.zeros(16, 1, d)
    # scores: one query against key 0 (pair 0 gives 1; pair 1 odd +2^24, then even -2^24: 0) and key 1 (0)
    q = torch.zeros(1, 1, d)
    q[0, 0, 0], q[0, 0, 2], q[0, 0, 3] = 1.0, big, big
    kc[0, 0, 0], kc[0, 0, 2], kc[0, 0, 3] = 1.0, -big, big
    vc[0] = 1.0
    # PV: 4 keys of score 0 (numerators 1) whose values add 1, 0, then -2^24 (key 2) and +2^24 (key 3): 0
    vc[4], vc[6], vc[7] = 1.0, -big * big, big * big
    slots = torch.tensor([0, 1, 4, 5, 6, 7])
    offs = torch.tensor([0, 2])
    qs = torch.cat([q, torch.zeros(1, 1, d)]).to(torch.bfloat16)
    kb, vb = kc.to(torch.bfloat16), vc.to(torch.bfloat16)
    seqs = [(0, 1, 2), (1, 1, 4)]
    for name in _isas():
        if name == "amx" and _amx_tiles_pairs():
            continue  # AMX-BF16 tiles round in an order of their own (test_amx_bf16_attention_rows_and_tails)
        bi.set_isa(name)
        out = attn(qs, kb, vb, seqs, slots, offs, 1.0).float()
        # scores 0 and 0: (1 + 0) / 2 (the even-first order: scores 1 and 0, 1 / (1 + e^-1) = 0.73)
        assert bool((out[0] == 0.5).all()), (name, out[0, 0, :4])
        # (1 + 0 + 2^24 - 2^24) / 4 in the odd-first order: 0 (even first: 0.25)
        assert bool((out[1] == 0.0).all()), (name, out[1, 0, :4])
    bi.set_isa("auto")


def _near_underflow(*shape, seed, lo=-75, hi=-55):
    """bf16 numbers of random sign and mantissa whose binary exponents run from lo to hi: products of two of
    them, and the chains' sums, fall below fp32's normal range (2^-126) in many places."""
    g = _gen(seed)
    e = torch.randint(lo, hi + 1, shape, generator=g).float()
    sign = torch.randint(0, 2, shape, generator=g).float() * 2 - 1
    return (sign * (1 + torch.rand(*shape, generator=g)) * torch.exp2(e)).to(torch.bfloat16)


def test_bf16_pairs_on_fmas_are_vdpbf16ps():
    """bf16 k-pairs on two fmas per pair ('fma' everywhere; 'mixed', from two rows: where vdpbf16ps issues slowly,
    Intel cores) give vdpbf16ps' bits, denormals included (the fmas run with denormals flushed, as vdpbf16ps always
    does): every row at every block size equals the row alone on vdpbf16ps, and a bf16 model's attention is the
    same in every mode, with products below fp32's normal range in the chains. A CPU without AVX512-BF16 has only
    'fma' (on AVX-512, else its own path): its rows, near underflow too, still equal each row alone."""
    bi.set_isa("avx512")  # not AMX-BF16 tiles, whose bits are their own; a CPU without AVX-512 keeps its path
    modes = [m for m in ("dp", "fma", "mixed") if bi.set_pairs(m) == m]
    k, n = 584, 200  # 292 k-pairs: past the last whole 16
    w, x = _near_underflow(n, k, seed=180), _near_underflow(17, k, seed=181)
    prods = x[0].float() * w[0].float()
    assert bool(((prods != 0) & (prods.abs() < 2.0 ** -126)).any())  # the data reach the denormals
    pk = bi.pack_linear_bf16_pairs(w)
    kc, vc, slots, offs = paged_layout([70, 33], 3, 64, seed=182, dtype=torch.bfloat16)
    vc = _near_underflow(*vc.shape, seed=183, lo=-135, hi=-120)  # numerators <= 1 times these: denormal products
    q = _randn(24, 6, 64, seed=184, dtype=torch.bfloat16)
    seqs = [(0, 16, 70), (16, 8, 33)]
    try:
        got = {}
        for mode in modes:
            assert bi.set_pairs(mode) == mode
            alone = torch.cat([bi.linear(x[i:i + 1], pk) for i in range(17)])
            got[mode] = [alone] + [bi.linear(x[:m], pk) for m in (2, 3, 8, 17)]
            got[mode].append(attn(q, kc, vc, seqs, slots, offs, 0.125))
    finally:
        bi.set_pairs("auto")
        bi.set_isa("auto")
    if "avx512_bf16" in bi._cpu_flags():
        assert modes == ["dp", "fma", "mixed"]
    ref = got[modes[0]]  # vdpbf16ps where the CPU has it
    for mode in modes:
        assert _same(got[mode][0], ref[0]), mode
        for m, out in zip((2, 3, 8, 17), got[mode][1:5]):
            assert _same(out, ref[0][:m]), (mode, m)
        assert _same(got[mode][5], ref[5]), mode
    assert bool((ref[5] != 0).any())


def test_attention_args_are_the_per_sequence_slots():
    """attention_args (AttentionBatch.build's kernel arguments in one op) against the slots written out per
    sequence from its block table: decode rows, a verify block, a prefill chunk, a block boundary, q_len 0."""
    bs = 4
    g = torch.Generator().manual_seed(7)
    rows = [(1, 9), (8, 20), (7, 7), (1, 1), (3, 8), (0, 5)]  # (q_len, kv_len)
    tables = [torch.randperm(64, generator=g)[:(kv + bs - 1) // bs + 2].tolist() for _, kv in rows]  # spare blocks
    blocks = [b for (_, kv), t in zip(rows, tables) for b in t[:(kv + bs - 1) // bs]]
    sm, q_start, q_len, kv_len, kv_slots, kv_offsets = bi.attention_args(
        [q for q, _ in rows], [kv for _, kv in rows], blocks, bs)
    per_seq = [torch.tensor([t[p // bs] * bs + p % bs for p in range(kv)], dtype=torch.int64)
               for (_, kv), t in zip(rows, tables)]
    assert torch.equal(kv_slots, torch.cat(per_seq))
    assert torch.equal(sm, torch.cat([s[kv - q:] for (q, kv), s in zip(rows, per_seq)]))
    starts = torch.tensor([0] + [q for q, _ in rows]).cumsum(0)[:-1]
    assert torch.equal(q_start, starts) and q_len.tolist() == [q for q, _ in rows]
    assert kv_len.tolist() == [kv for _, kv in rows]
    assert kv_offsets.tolist() == torch.tensor([0] + [kv for _, kv in rows]).cumsum(0)[:-1].tolist()
    with pytest.raises(RuntimeError, match="blocks given"):
        bi.attention_args([1], [9], blocks[:2], bs)
    with pytest.raises(RuntimeError, match="q_len"):
        bi.attention_args([3], [2], blocks[:1], bs)


# ---- tracing ----------------------------------------------------------------------------------------------------

def test_torch_compile_traces_ops():
    k, n = 64, 96
    pk = bi.pack_linear(_randn(n, k, seed=140))
    w = _randn(k, seed=141)

    def f(x, gate, up):
        return bi.silu_mul(gate, up), bi.linear(bi.rms_norm(x, w, 1e-5), pk)

    x, g, u = _randn(3, k, seed=142), _randn(3, 10, seed=143), _randn(3, 10, seed=144)
    cf = torch.compile(f, backend="aot_eager", fullgraph=True)
    a, b = cf(x, g, u)
    ea, eb = f(x, g, u)
    assert _same(a, ea) and _same(b, eb)
    kc, vc, slots, offs = paged_layout([20], 1, 64, seed=145)
    q = _randn(4, 2, 64, seed=146)
    args = (torch.tensor([0]), torch.tensor([4]), torch.tensor([20]), slots, offs, 0.125, True)
    torch.library.opcheck(torch.ops.dflash_trt.bi_paged_attention.default, (q, kc, vc) + args,
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.dflash_trt.bi_linear.default, (x, pk.data, n, None, 2),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.dflash_trt.bi_add_rms_norm.default, (x, x, w, 1e-5),
                          test_utils=("test_schema", "test_faketensor"))


def test_linear_is_whole_when_the_runtime_gives_fewer_threads(tmp_path):
    """OpenMP may give a parallel region fewer threads than asked (a thread limit, nested regions, a second
    runtime in the process): every tile must still be computed, by the threads there are."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import torch
        from dflash_trt.plugins import invariant as bi
        bi.load()
        torch.set_num_threads(2)  # the kernel splits the work in 2 tiles; the runtime gives 1 thread
        g = torch.Generator().manual_seed(0)
        w, x = torch.randn(1728, 576, generator=g), torch.randn(8, 576, generator=g)
        for pk in (bi.pack_linear(w), bi.pack_linear_w8a8(w)):
            y = bi.linear(x, pk)
            torch.set_num_threads(1)
            assert torch.equal(y, bi.linear(x, pk)), "tiles left out"
            torch.set_num_threads(2)
        print("ok")
    """)
    env = dict(__import__("os").environ, OMP_THREAD_LIMIT="1")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
