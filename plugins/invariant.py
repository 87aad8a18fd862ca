"""Batch-invariant CPU kernels: the same row gives the same bits whatever batch it is computed in.

Autoregressive decoding runs the target on 1 row per sequence; speculative verification runs K+1 rows per
sequence with many sequences packed together. With a BLAS, `x[:1] @ W.T` and `(x @ W.T)[:1]` differ in the last
bits (the blocking depends on M), near-ties flip the argmax and greedy outputs diverge. These kernels compute
every output element with one fixed sequence of fp32 operations that depends only on that element's inputs:

* linear: y[m, n] = tree over k_splits equal contiguous K chunks of (an FMA chain over k ascending, from +0),
  tree = ((c0+c1)+(c2+c3))+((c4+c5)+(c6+c7)), then + bias. Weight panels in fp32, bf16, e4m3 or int8; the
  8-bit ones are widened in registers, the chains run over the codes' exact values and each chunk's partial
  is scaled once by its column's scale (W8A16: the dequantised weight to fp32 rounding, with no multiply per
  weight) while a decode step streams one byte per weight. A
  tensor-parallel rank owning an aligned block of chunks computes the matching subtree (`linear_partial`),
  and `tree_sum` of the ranks' partials in rank order is bitwise the full result.
* rms_norm: 16-lane FMA sum of squares, fixed horizontal tree, 1/sqrtf(mean + eps), HF casting rules.
* silu_mul: one formula per element (own exp), masked vector tails.
* paged_attention: per (query row, head): 16-lane dot products over D with a fixed horizontal tree, max,
  exp, lane-strided sum with a fixed tree, then sum_j p_j v_j over keys in order, divided by the sum.

The AMX, AVX-512, AVX2 and portable paths are bitwise equal (tests check it); the best one runs
(`DFLASH_BI_ISA=amx|avx512|avx2|scalar` or `set_isa` overrides; amx is AVX-512 with the W8A8 integer sums
of 8 or more rows on AMX-INT8 tiles). Threads (torch.set_num_threads) split output tiles only, so the thread
count never changes a result.
"""
from __future__ import annotations

import functools

import os
from dataclasses import dataclass

import torch

from dflash_trt.plugins.build import load_extension

_SOURCE = "invariant.cpp"
_ops_loaded = False


def load() -> None:
    """Build (first time, ~1 min) and load the extension; idempotent."""
    global _ops_loaded
    if _ops_loaded:
        return
    load_extension("dflash_bi", [_SOURCE])
    _register_fakes()
    _ops_loaded = True


_bindings: dict = {}  # op name -> its C++ binding (binding())


def _ops():
    if not _ops_loaded:
        load()
    return torch.ops.dflash_trt


def binding(name: str):
    """dflash_trt::name's default overload as its C++ binding, looked up once, for ops called every step: the
    overload's __call__ first walks its arguments for fake script objects (tracing only), which costs about as
    much as a small op's own work."""
    op = _bindings.get(name)
    if op is None:
        overload = getattr(_ops(), name).default
        op = _bindings[name] = getattr(overload, "_op", overload)
    return op


def _register_fakes() -> None:
    lib = "dflash_trt::"

    def reg(name, fn):
        try:
            torch.library.register_fake(lib + name)(fn)
        except RuntimeError as e:  # already registered (module reloaded)
            if "already" not in str(e):
                raise

    reg("bi_linear", lambda x, packed, n, bias=None, k_splits=1, wscale=None: x.new_empty((x.shape[0], n)))
    reg("bi_linear_silu", lambda x, packed, n, inter, up_col, bias=None, k_splits=1, wscale=None:
        x.new_empty((x.shape[0], inter)))
    reg("bi_norm_linear", lambda x, residual, weight, eps, packed, n, bias, k_splits, wscale, inter, up_col: (
        x.new_empty((x.shape[0], inter if inter > 0 else n), dtype=torch.promote_types(x.dtype, weight.dtype)),
        x.new_empty(x.shape if residual is not None else (0,))))
    reg("bi_linear_partial", lambda x, packed, n, chunk_begin, chunk_end, k_splits, wscale=None:
        x.new_empty((x.shape[0], n), dtype=torch.float32))
    reg("bi_rms_norm", lambda x, weight, eps: x.new_empty(
        x.shape, dtype=torch.promote_types(x.dtype, weight.dtype)))
    reg("bi_add_rms_norm", lambda x, residual, weight, eps: (
        x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype)), x.new_empty(x.shape)))
    reg("bi_silu_mul", lambda gate, up: gate.new_empty(gate.shape))
    reg("bi_head_argmax", lambda x, packed, n, wscale, ids, confidence: (
        x.new_empty((x.shape[0],), dtype=torch.int64), x.new_empty((x.shape[0] if confidence else 0,),
                                                                   dtype=torch.float32)))
    reg("bi_paged_attention", lambda q, k_cache, v_cache, q_start, q_len, kv_len, kv_slots, kv_offsets, scale,
        causal=True: q.new_empty(q.shape))


def set_isa(name: str = "") -> str:
    """Force a code path ('amx', 'avx512', 'avx2', 'scalar', 'auto'); '' only reports the active one. A path
    this CPU lacks leaves the active one in place: the returned name says which runs."""
    try:
        return _ops().bi_set_isa(name)
    except RuntimeError as e:
        if "lacks" not in str(e):
            raise
        return _ops().bi_set_isa("")


def set_pairs(mode: str = "") -> str:
    """Force how bf16 k-pairs multiply on the AVX-512 path: 'dp' (vdpbf16ps), 'fma' (two fmas per pair, denormals
    flushed as vdpbf16ps flushes them: the same bits), 'mixed' (vdpbf16ps for one row, fmas for more rows and a
    bf16 model's attention), or 'auto' (mixed where vdpbf16ps issues at under 1 / 2.5 of the fma rate, timed
    once; else dp); '' only reports the active one. The choice changes speed, never a result. DFLASH_BI_PAIRS
    sets the first choice."""
    return _ops().bi_set_pairs(mode)


# ---- linear -------------------------------------------------------------------------------------------------

PANEL = 32
# bf16 panels hold 16 u32 per k: the high half is column j, the low half column j + 16 (so one AND and one
# shift widen 32 columns to fp32); in bf16 element order that is 16, 0, 17, 1, ..., 31, 15.
_BF16_ORDER = torch.tensor([c for j in range(16) for c in (j + 16, j)])


@dataclass(frozen=True)
class PackedLinear:
    """A weight [N, K] as K-major panels of 32 output columns: data [ceil(N/32), K, 32] (N padded with 0).
    fp8 panels (uint8 e4m3 codes) carry scale: float32 [ceil(N/32) * 32], the per-column dequantisation scale
    times 256 (the kernel widens e4m3 through fp16, which divides by 256 exactly). int8 panels (torch.int8
    codes) carry the per-column scale itself."""
    data: torch.Tensor
    n: int
    k: int
    scale: torch.Tensor | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    def nbytes(self) -> int:
        extra = self.scale.numel() * 4 if self.scale is not None else 0
        return self.data.numel() * self.data.element_size() + extra


def _whole_panels(w: torch.Tensor) -> torch.Tensor:
    """w [N, ...] with zero rows appended up to a whole number of PANEL-column panels."""
    pad = -w.shape[0] % PANEL
    return torch.cat([w, w.new_zeros(pad, *w.shape[1:])]) if pad else w


def pack_linear_fp8(weight: torch.Tensor, scale: torch.Tensor) -> PackedLinear:
    """Keep a float8_e4m3fn weight [N, K] quantized: 1 byte per weight, y that of the dequantised weight
    (weight.float() * scale, scale a scalar or one per output row) to fp32 rounding: the chains run over the
    e4m3 values / 256 (exact), each chunk's partial times scale * 256."""
    assert weight.dim() == 2 and weight.dtype == torch.float8_e4m3fn, "weight must be float8_e4m3fn [N, K]"
    n, k = weight.shape
    p = (n + PANEL - 1) // PANEL
    s = scale.detach().float().cpu().flatten()
    assert s.numel() in (1, n), "scale: a scalar or one per output row"
    s = (s.expand(n) if s.numel() == 1 else s) * 256.0
    w, s = _whole_panels(weight.detach().cpu().view(torch.uint8)), _whole_panels(s)
    return PackedLinear(w.view(p, PANEL, k).permute(0, 2, 1).contiguous(), n, k, s.contiguous())


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-row symmetric int8: (codes int8 [N, K], scale float32 [N]) with scale = max|w_row| / 127 and
    codes = w / scale rounded to nearest (ties to even). The dequantised weight is codes.float() * scale[:, None]."""
    assert weight.dim() == 2, "weight must be [N, K]"
    w = weight.detach().to(device="cpu", dtype=torch.float32)
    scale = w.abs().amax(dim=1) / 127.0 if w.shape[1] else w.new_zeros(w.shape[0])
    div = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row: codes 0 whatever the scale
    q = torch.round(w / div[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def _int8_padded(weight: torch.Tensor, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(codes [P * 32, K], scales [P * 32], n): a float weight quantised by quantize_int8, or int8 codes with
    their per-row scale, padded with zero rows to whole panels."""
    if weight.dtype != torch.int8:
        assert scale is None, "a float weight is quantised here: pass no scale"
        weight, scale = quantize_int8(weight)
    assert weight.dim() == 2 and scale is not None, "int8 codes [N, K] need their scale"
    n = weight.shape[0]
    s = scale.detach().float().cpu().flatten()
    assert s.numel() == n, "scale: one per output row"
    return _whole_panels(weight.detach().cpu()), _whole_panels(s).contiguous(), n


def pack_linear_int8(weight: torch.Tensor, scale: torch.Tensor | None = None) -> PackedLinear:
    """int8 panels (W8A16): 1 byte per weight, widened in registers, the chains over the codes and each chunk's
    partial times the row's scale: y that of the dequantised weight (codes.float() * scale) to fp32 rounding.
    weight: a float [N, K] (quantised with quantize_int8), or int8 codes [N, K] with their scale (one per
    output row)."""
    w, s, n = _int8_padded(weight, scale)
    k = w.shape[1]
    return PackedLinear(w.view(-1, PANEL, k).permute(0, 2, 1).contiguous(), n, k, s)


def pack_linear_w8a8(weight: torch.Tensor, scale: torch.Tensor | None = None) -> PackedLinear:
    """int8 weights for integer dot products (W8A8): the codes and scales of pack_linear_int8, laid out in
    k-quads (int32 [P, K/4, 32], byte b of an int32 is k = 4q + b) as AVX-512 VNNI reads them. The kernel
    quantises x per row and K chunk (max|x| / 127, round to nearest), so a row never depends on its batch; the
    integer sums are exact on every ISA. K must be a multiple of 4 (of 4 * k_splits under chunked sums)."""
    assert weight.dim() == 2 and weight.shape[1] % 4 == 0, f"W8A8 panels need K divisible by 4, got {weight.shape}"
    w, s, n = _int8_padded(weight, scale)
    k = w.shape[1]
    quads = w.view(-1, PANEL, k // 4, 4).permute(0, 2, 1, 3).contiguous()
    return PackedLinear(quads.view(torch.int32).view(-1, k // 4, PANEL), n, k, s)


def pack_linear(weight: torch.Tensor, dtype: torch.dtype | None = None) -> PackedLinear:
    """Pack once at load. dtype: torch.float32 or torch.bfloat16 (default: the weight's own if one of those,
    else float32). bf16 halves memory traffic; accumulation is fp32 either way."""
    assert weight.dim() == 2, "weight must be [N, K]"
    if dtype is None:
        dtype = weight.dtype if weight.dtype in (torch.float32, torch.bfloat16) else torch.float32
    assert dtype in (torch.float32, torch.bfloat16), dtype
    n, k = weight.shape
    p = (n + PANEL - 1) // PANEL
    w = _whole_panels(weight.detach().to(device="cpu", dtype=dtype)).view(p, PANEL, k)
    if dtype == torch.bfloat16:
        w = w[:, _BF16_ORDER, :]
    data = w.permute(0, 2, 1).contiguous()
    return PackedLinear(data, n, k)


def bf16_pairs_pay() -> bool:
    """Whether bf16 k-pair panels beat widened bf16 panels on this CPU: where vdpbf16ps does twice the
    multiply-adds of an fp32 FMA per cycle (AVX512-BF16 without AMX: AMD Zen 4 and later), where the amx path runs
    them on AMX-BF16 tiles, and on Intel cores with AVX512-BF16 but no AMX, whose slow vdpbf16ps set_pairs' 'auto'
    leaves to one-row tiles (two fmas per pair multiply more rows: widened panels' speed at half their bytes). On
    AMX Xeons a forced avx512 path keeps widened panels. All are batch-invariant; the choice only sets which bits
    a bf16 model gets here."""
    flags = _cpu_flags()
    if "amx_bf16" in flags:
        return set_isa("") == "amx"
    return "avx512_bf16" in flags


@functools.lru_cache(maxsize=1)
def int8_dots_pay() -> bool:
    """Whether W8A8 runs on integer dot products here (AVX-512 VNNI or AMX-INT8): 64 multiply-adds per
    instruction, twice vdpbf16ps and four times an fp32 FMA, so a pass of several rows costs half a bf16 one."""
    flags = _cpu_flags()
    return "avx512_vnni" in flags or "amx_int8" in flags


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> frozenset:
    """The CPU's feature flags as Linux lists them (empty where /proc/cpuinfo cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return frozenset()


def pack_linear_bf16_pairs(weight: torch.Tensor) -> PackedLinear:
    """bf16 weights for bf16 x bf16 dot products: int16 panels [P, K, 32] holding, per pair of k and column, the
    bf16 of k = 2q in the low half and of k = 2q + 1 in the high half of a 32-bit lane (AVX512-BF16's
    vdpbf16ps operand). The kernel rounds x to bf16 (nearest even) and accumulates each k-pair in fp32, the odd
    k first: on a CPU without AVX512-BF16 two fmas in that order give the same bits. K must be even (a multiple
    of 2 * k_splits under chunked sums)."""
    assert weight.dim() == 2 and weight.shape[1] % 2 == 0, f"bf16 pair panels need an even K, got {weight.shape}"
    n, k = weight.shape
    p = (n + PANEL - 1) // PANEL
    w = _whole_panels(weight.detach().to(device="cpu", dtype=torch.bfloat16))
    pairs = w.view(p, PANEL, k // 2, 2).permute(0, 2, 1, 3).contiguous()  # [P, K/2, 32, 2]
    return PackedLinear(pairs.view(torch.int16).view(p, k, PANEL), n, k)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def linear(x: torch.Tensor, packed: PackedLinear, bias: torch.Tensor | None = None,
           k_splits: int = 1) -> torch.Tensor:
    """y = x @ W.T + bias, x [..., K] float32 or bfloat16 (output in x's dtype)."""
    y = _ops().bi_linear(_rows(x), packed.data, packed.n, bias, k_splits, packed.scale)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], packed.n)


def linear_silu(x: torch.Tensor, packed: PackedLinear, inter: int, up_col: int, bias: torch.Tensor | None = None,
                k_splits: int = 1) -> torch.Tensor:
    """silu_mul(y[:, :inter], y[:, up_col:up_col + inter]) of y = linear(x, packed, bias, k_splits), x [M, K], in
    one op (a fused gate|up projection, up starting at a panel boundary: plugins/layer.py concat_packed)."""
    return _ops().bi_linear_silu(_rows(x), packed.data, packed.n, inter, up_col, bias, k_splits, packed.scale)


def norm_linear(x: torch.Tensor, weight: torch.Tensor, eps: float, packed: PackedLinear,
                bias: torch.Tensor | None = None, k_splits: int = 1, residual: torch.Tensor | None = None,
                inter: int = 0, up_col: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(linear(rms_norm(x + residual, weight, eps), packed, bias, k_splits), x + residual) in one op, x [M, H];
    with inter > 0 the first is linear_silu's SiLU(gate) * up instead. The second is None without a residual.
    Each thread norms every row itself, so the normed rows never cross between cores; the bits are the
    op-by-op path's."""
    y, x1 = _ops().bi_norm_linear(_rows(x), residual if residual is None else _rows(residual), weight, eps,
                                  packed.data, packed.n, bias, k_splits, packed.scale, inter, up_col)
    return y, (x1 if residual is not None else None)


def greedy_head(x: torch.Tensor, pairs: bool, out_idx: torch.Tensor, screen: PackedLinear, chunks: int,
                wo: torch.Tensor, g: torch.Tensor, g_max: torch.Tensor, gap_rel: float, head: PackedLinear,
                rows: torch.Tensor, max_candidates: int) -> torch.Tensor:
    """runtime/greedy_head.py's exact greedy screen in one op: each row's argmax token, or an empty tensor when
    the caller must compute the logits. rows: the head's weight, row-major [V, K] (float32, or bfloat16 for bf16
    panels): the candidates' exact logits are packed from its rows, rounded to bf16 for bf16 panels."""
    return binding("bi_greedy_head")(x, pairs, out_idx, screen.data, screen.n, screen.scale, chunks, wo, g, g_max,
                                     gap_rel, head.data, rows, max_candidates)


def head_argmax(x: torch.Tensor, head: PackedLinear, ids: torch.Tensor | None = None,
                confidence: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(torch.argmax(logits, -1) mapped through ids (int64 token ids, one per head row) when given, and with
    confidence each row's softmax probability of it, else None) for logits = linear(x, head), in one op."""
    tokens, conf = binding("bi_head_argmax")(x, head.data, head.n, head.scale, _NO_IDS if ids is None else ids,
                                             confidence)
    return tokens, conf if confidence else None


_NO_IDS = torch.empty(0, dtype=torch.int64)


def linear_partial(x: torch.Tensor, packed: PackedLinear, chunk_begin: int, chunk_end: int,
                   k_splits: int) -> torch.Tensor:
    """fp32 tree-sum of chunks [chunk_begin, chunk_end) of the k_splits chunks of K (a power-of-two count
    aligned to its size), no bias. x holds either all K columns or exactly those chunks' columns.

    Tensor parallel: rank r of tp (K sliced) may equally pack its own weight slice and call
    linear_partial(x_slice, packed_slice, 0, k_splits // tp, k_splits // tp)."""
    y = _ops().bi_linear_partial(_rows(x), packed.data, packed.n, chunk_begin, chunk_end, k_splits, packed.scale)
    return y if x.dim() == 2 else y.view(*x.shape[:-1], packed.n)


def tree_sum(partials: list[torch.Tensor], bias: torch.Tensor | None = None,
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Combine fp32 partials of consecutive aligned chunk blocks (in chunk order, power-of-two count) with the
    same pairwise tree as linear, add bias, cast: bitwise equal to linear(x, packed, bias, k_splits)."""
    ps = list(partials)
    assert ps and (len(ps) & (len(ps) - 1)) == 0, "tree_sum needs a power-of-two number of partials"
    while len(ps) > 1:
        ps = [ps[i] + ps[i + 1] for i in range(0, len(ps), 2)]
    y = ps[0]
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y if out_dtype is None else y.to(out_dtype)


# ---- elementwise / norm ---------------------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF RMSNorm: weight * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype)."""
    return _ops().bi_rms_norm(x, weight, float(eps))


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass; the sum is rounded to x.dtype first."""
    return _ops().bi_add_rms_norm(x, residual, weight, float(eps))


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up; gate/up may be strided views (e.g. halves of a fused gate_up output)."""
    return _ops().bi_silu_mul(gate, up)


# ---- attention -------------------------------------------------------------------------------------------------

def attention_args(q_lens: list[int], kv_lens: list[int], blocks: list[int], block_size: int) -> list[torch.Tensor]:
    """paged_attention's per-batch arguments and the new rows' cache slots in one op: [slot_mapping, q_start,
    q_len, kv_len, kv_slots, kv_offsets] for sequences of q_lens new rows over kv_lens keys, whose cache blocks
    are the next ceil(kv_len / block_size) entries of `blocks` each."""
    return binding("bi_attention_args")(q_lens, kv_lens, blocks, block_size)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, q_start: torch.Tensor,
                    q_len: torch.Tensor, kv_len: torch.Tensor, kv_slots: torch.Tensor, kv_offsets: torch.Tensor,
                    scale: float, causal: bool = True) -> torch.Tensor:
    """q [T, H, D]; caches [S, KVH, D] (or [blocks, block_size, KVH, D]); per sequence b: rows
    q_start[b] .. +q_len[b] at positions kv_len[b]-q_len[b] .. kv_len[b]-1, their keys at cache rows
    kv_slots[kv_offsets[b] + j], j < kv_len[b]. Causal: row i sees keys 0..kv_len-q_len+i; else all kv_len.
    GQA: head h reads kv head h // (H // KVH). Output in q's dtype; rows of no sequence are 0."""
    return _ops().bi_paged_attention(q, k_cache, v_cache, q_start, q_len, kv_len, kv_slots, kv_offsets,
                                     float(scale), bool(causal))


__all__ = ["PackedLinear", "pack_linear", "pack_linear_fp8", "pack_linear_int8", "quantize_int8", "linear",
           "linear_partial", "tree_sum", "rms_norm", "add_rms_norm", "silu_mul", "paged_attention", "set_isa", "load"]

if os.environ.get("DFLASH_BI_EAGER_LOAD"):
    load()
