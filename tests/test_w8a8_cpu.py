"""W8A8 linears (int8 weights in k-quads, activations quantised per row and K chunk inside the kernel): every
SIMD path (AMX-INT8 tiles, AVX-512 VNNI, AVX2 pmaddwd, scalar) gives exactly the integer reference below, so
the paths agree bitwise. Batch and thread invariance and the engine option (weights="w8a8") are checked with
the int8 ones in test_int8_cpu.py."""
import pytest
import torch

from dflash_trt.plugins import invariant as bi


pytestmark = pytest.mark.usefixtures("invariant_kernels")


def _reference(x, w, bias=None, k_splits=1, chunks=None):
    """The kernel's definition in torch: per row and chunk a = max|x|, codes rint(x * (127 / a)) clamped to
    +-127, the exact integer dot product with the int8 weight codes, then (float(isum) * a / 127) * w_scale,
    and the pairwise tree over chunks (chunks: the [begin, end) a partial sums, no bias)."""
    q, ws = bi.quantize_int8(w)
    x = x.float()
    k = x.shape[1]
    cl = k // k_splits
    begin, end = chunks or (0, k_splits)
    parts = []
    for c in range(begin, end):
        xc = x[:, c * cl:(c + 1) * cl]
        a = xc.abs().amax(1, keepdim=True)
        c127 = torch.full_like(a, 127.0)  # tensor / tensor: `127.0 / a` is a.reciprocal() * 127, not one rounding
        inv = torch.where(a > 0, c127 / a, torch.zeros_like(a))
        xq = torch.round(xc * inv).clamp(-127, 127).to(torch.int64)
        isum = (xq @ q[:, c * cl:(c + 1) * cl].to(torch.int64).T).to(torch.float32)
        parts.append(isum * torch.where(a > 0, a / c127, torch.zeros_like(a)) * ws)
    st = 1
    while st < len(parts):
        for c in range(0, len(parts) - st, 2 * st):
            parts[c] = parts[c] + parts[c + st]
        st *= 2
    return parts[0] if bias is None else parts[0] + bias


@pytest.mark.parametrize("isa", ["amx", "avx512", "avx2", "scalar"])
def test_w8a8_is_the_integer_reference_on_every_isa(isa):
    if bi.set_isa(isa) != isa:
        pytest.skip(f"{isa} not available on this CPU")
    g = torch.Generator().manual_seed(0)
    for n, k in [(37, 64), (96, 576), (64, 8), (33, 1536)]:
        w = torch.randn(n, k, generator=g) * 3
        w[0, :4] = torch.tensor([-1e3, 1e3, 0.0, -0.0])
        pk = bi.pack_linear_w8a8(w)
        assert pk.data.dtype == torch.int32 and pk.nbytes() == n * 0 + pk.data.shape[0] * 32 * (k + 4)  # 1 B/weight
        for m in (1, 3, 8, 13, 16, 17, 29):  # AMX tiles: 16 rows in one block, 17 and 29 in blocks of two sizes
            x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4
            x[0, :3] = torch.tensor([40.0, -40.0, 0.0])  # a row whose maximum is an outlier
            if m > 2:
                x[1] = 0  # an all-zero row: its scale is 0
            bias = torch.randn(n, generator=g)
            for ks in ((1, 2, 8) if k % 32 == 0 else (1, 2)) if k % 8 == 0 else (1,):  # 8: the o / down split
                assert torch.equal(bi.linear(x, pk, bias, ks), _reference(x, w, bias, ks)), (isa, n, k, m, ks)
            xb = x.to(torch.bfloat16)
            yb = bi.linear(xb, pk)
            assert yb.dtype == torch.bfloat16 and torch.equal(yb, _reference(xb, w).to(torch.bfloat16))
        if k % 32 == 0:  # tensor-parallel partial sums of chunks 2..3 of 8: x whole, or only those columns
            x = torch.randn(4, k, generator=g)
            ref = _reference(x, w, None, 8, (2, 4))
            assert torch.equal(bi.linear_partial(x, pk, 2, 4, 8), ref)
            assert torch.equal(bi.linear_partial(x[:, 2 * k // 8:4 * k // 8].contiguous(), pk, 2, 4, 8), ref)
    bi.set_isa("auto")


def test_w8a8_is_close_to_float_and_checks_its_inputs():
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(256, 576, generator=g) * 0.05, torch.randn(8, 576, generator=g)
    y, ref = bi.linear(x, bi.pack_linear_w8a8(w)), x @ w.T
    assert 0 < (y - ref).abs().max() < 0.03 * ref.abs().max()  # two 8-bit roundings: close, not equal
    pk = bi.pack_linear_w8a8(torch.randn(32, 8))
    with pytest.raises(RuntimeError, match="int8 W8A8 packed weight needs its float32"):
        torch.ops.dflash_trt.bi_linear(torch.randn(1, 8), pk.data, 32, None, 1, None)
    with pytest.raises(RuntimeError, match="multiple of 4 columns"):
        bi.linear(torch.randn(1, 8), pk, None, 4)
    with pytest.raises(AssertionError, match="K divisible by 4"):
        bi.pack_linear_w8a8(torch.randn(32, 6))
