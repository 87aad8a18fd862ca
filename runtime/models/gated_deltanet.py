"""Gated DeltaNet linear attention (Qwen3.5, Qwen3.6, Qwen3-Next) with an explicit per-sequence state.

A linear-attention layer keeps no KV cache: per sequence it carries a convolution state (the last K-1 inputs of
its depthwise causal convolution) and a recurrent state S [v_heads, k_dim, v_dim] updated per token by the gated
delta rule:  S <- exp(g) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = S^T q.  Rejected draft tokens cannot be
undone by moving a length pointer, so `GatedDeltaNet.run` takes and returns each segment's state explicitly and,
for verify segments, also returns either the state after EVERY row (the caller keeps the one after the accepted
prefix: the vLLM / TensorRT-LLM way) or the rows' recurrence inputs, from which `replay` rebuilds the state after
the accepted prefix at a fraction of the memory. Calling `run` again from the pre-verify state over the accepted
tokens is plain snapshot-and-replay. All three give the same bits (see docs/hybrid.md).

Two kernels for the delta rule. The recurrent one (decode and verify rows; everything when bitwise invariance
matters) is built only from elementwise ops, which IEEE rounds the same way in vector and scalar code, and
fixed-order pairwise reductions: a segment's result does not depend on which other segments share the batch or
on how many rows it has. The chunked one (long prefills) turns each 64-token chunk into a few matmuls and a
triangular solve: faster, equal within fp32 rounding, but its bits depend on where chunks start.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from .family import rowwise
from .target import Linear

L2_EPS = 1e-6  # the FLA kernels' (and transformers') eps inside l2norm


@dataclass(frozen=True)
class DeltaNetDims:
    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    eps: float  # the gated RMSNorm's
    fused_qkvz: bool  # Qwen3-Next: in_proj_qkvz / in_proj_ba grouped per key head; Qwen3.5: four projections

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def group(self) -> int:
        return self.num_v_heads // self.num_k_heads

    def conv_state_shape(self) -> tuple[int, int]:
        return (self.conv_dim, self.conv_kernel - 1)

    def recurrent_state_shape(self) -> tuple[int, int, int]:
        return (self.num_v_heads, self.head_k_dim, self.head_v_dim)

    def state_bytes(self, conv_dtype: torch.dtype = torch.bfloat16) -> int:
        """One sequence's state in one layer: conv state in the model dtype, recurrent state in fp32."""
        c, k = self.conv_state_shape()
        h, dk, dv = self.recurrent_state_shape()
        return c * k * torch.empty((), dtype=conv_dtype).element_size() + h * dk * dv * 4


def tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` by repeated halving (zero-padded to a power of two): one fixed order of additions per
    element, whatever the other dimensions, so reductions inside the recurrence stay batch invariant."""
    dim = dim % x.dim()
    n = x.shape[dim]
    p = 1 << max(0, (n - 1).bit_length())
    if p != n:
        pad = [0, 0] * (x.dim() - dim - 1) + [0, p - n]
        x = F.pad(x, pad)
    while p > 1:
        p //= 2
        x = x.narrow(dim, 0, p) + x.narrow(dim, p, p)
    return x.squeeze(dim)


def _rows(fn, x: torch.Tensor) -> torch.Tensor:
    """An elementwise transcendental on any shape, row by row over the last dim (see family.rowwise)."""
    return rowwise(fn, x.reshape(-1, x.shape[-1])).reshape(x.shape)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * _rows(torch.rsqrt, tree_sum(x * x, -1) + L2_EPS)[..., None]


def recurrent_gated_delta_rule(q, k, v, decay, beta, starts, lens, state, keep=()):
    """Token by token. q, k: [T, Hv, Dk] (l2-normed, q scaled); v: [T, Hv, Dv]; decay = exp(g), beta: [T, Hv];
    segment s owns rows starts[s] .. starts[s] + lens[s] - 1; state: [B, Hv, Dk, Dv] fp32 (not modified).
    Returns o [T, Hv, Dv] fp32, the final states [B, ...] and, for each segment index in `keep`, its state
    after every row [lens[s], Hv, Dk, Dv]."""
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    inter = {s: [] for s in keep}
    for t in range(max(lens, default=0)):
        active = [s for s, n in enumerate(lens) if n > t]
        everyone = len(active) == len(lens)  # the common case (equal verify blocks, decode rows): no gather
        rows = torch.tensor([starts[s] + t for s in active], device=v.device)
        sel = None if everyone else torch.tensor(active, device=v.device)
        st = (state if everyone else state.index_select(0, sel)) * decay.index_select(0, rows)[..., None, None]
        kt = k.index_select(0, rows)[..., :, None]
        mem = tree_sum(st * kt, -2)
        delta = (v.index_select(0, rows) - mem) * beta.index_select(0, rows)[..., None]
        st = st + kt * delta[..., None, :]
        out.index_copy_(0, rows, tree_sum(st * q.index_select(0, rows)[..., :, None], -2))
        # out of place: earlier steps' tensors are still referenced by the kept per-row states
        state = st if everyone else state.index_copy(0, sel, st)
        for j, s in enumerate(active):
            if s in inter:
                inter[s].append(st[j])
    return out, state, {s: torch.stack(xs) if xs else state.new_zeros(0, *state.shape[1:])
                        for s, xs in inter.items()}


def chunked_gated_delta_rule(q, k, v, g, beta, state, chunk: int = 16):
    """One segment, chunk by chunk (the UT transform): q, k [L, Hv, Dk], v [L, Hv, Dv], g (log decay) and beta
    [L, Hv], state [Hv, Dk, Dv] fp32. Returns o [L, Hv, Dv] fp32 and the final state.

    The chunk is 16 rows, not the usual 64: the unit-triangular solve grows fp32 error with the chunk. Against
    the row-by-row recurrence, a 150-row Qwen3-Next prefill measured 9.0e-4 (relative, logits) at 64 rows,
    1.6e-4 at 32 and 2.5e-5 at 16 (transformers' own chunk-64 fallback: 3.4e-4).

    Inside a chunk with cumulative log decay c_t and the chunk's initial state S0, the delta rule unrolls to
    (I + A) U = beta V - beta exp(c) K S0 with A[t, j] = beta_t exp(c_t - c_j) k_t.k_j (j < t); then
    o_t = exp(c_t) S0^T q_t + sum_{j<=t} exp(c_t - c_j) (q_t.k_j) u_j and
    S = exp(c_C) S0 + sum_j exp(c_C - c_j) k_j u_j^T.
    """
    q, k, v = (x.float().transpose(0, 1) for x in (q, k, v))  # [Hv, L, D]
    g, beta = g.float().T, beta.float().T  # [Hv, L]
    n = q.shape[1]
    out = torch.empty_like(v)
    s = state.float()
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        qc, kc, vc, bc = q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b, None]
        c = g[:, a:b].cumsum(-1)  # [Hv, C]
        diff = c[:, :, None] - c[:, None, :]
        causal = torch.ones(b - a, b - a, dtype=torch.bool, device=q.device).tril()
        dec = diff.masked_fill(~causal, float("-inf")).exp()  # exp(c_t - c_j), j <= t
        strict = (bc * (kc @ kc.transpose(-1, -2)) * dec).tril(-1)
        w = strict + torch.eye(b - a, device=q.device)
        rhs = torch.cat([bc * vc, bc * c.exp()[..., None] * kc], -1)
        sol = torch.linalg.solve_triangular(w, rhs, upper=False, unitriangular=True)
        u = sol[..., :vc.shape[-1]] - sol[..., vc.shape[-1]:] @ s
        out[:, a:b] = (c.exp()[..., None] * qc) @ s + ((qc @ kc.transpose(-1, -2)) * dec) @ u
        s = c[:, -1, None, None].exp() * s + (kc * (c[:, -1:] - c).exp()[..., None]).transpose(-1, -2) @ u
    return out.transpose(0, 1), s


class _Conv(nn.Module):
    """Holds the depthwise kernel under transformers' name (conv1d.weight [conv_dim, 1, K])."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel), requires_grad=False)


def causal_conv(x: torch.Tensor, starts, lens, conv_state: torch.Tensor, weight: torch.Tensor):
    """Depthwise causal conv + SiLU over packed segments. x: [T, C]; conv_state: [B, C, K-1] (each segment's
    last K-1 inputs before its first row); weight: [C, K]. Returns the activations [T, C] and, per segment, its
    window [K-1+L, C]: the state after row j is window[j+1 : j+K] (transposed)."""
    kk = weight.shape[1]
    windows = [torch.cat([conv_state[s].T.to(x.dtype), x[starts[s]:starts[s] + n]]) for s, n in enumerate(lens)]
    flat = torch.cat(windows) if windows else x.new_zeros(0, x.shape[1])
    idx, base = [], 0
    for n in lens:
        idx.append(base + torch.arange(n)[:, None] + torch.arange(kk)[None, :])
        base += n + kk - 1
    idx = torch.cat(idx).to(x.device) if idx else torch.zeros(0, kk, dtype=torch.int64, device=x.device)
    taps = flat[idx].float()  # [T, K, C]
    w = weight.float().T  # [K, C]
    acc = taps[:, 0] * w[0]
    for j in range(1, kk):  # separate mul and add: no FMA contraction whose use would depend on the vector path
        acc = acc + taps[:, j] * w[j]
    return _rows(F.silu, acc.to(x.dtype)), windows


class GatedDeltaNet(nn.Module):
    """transformers' Qwen3_5GatedDeltaNet / Qwen3NextGatedDeltaNet, parameter names included."""

    def __init__(self, d: DeltaNetDims):
        super().__init__()
        self.d = d
        h = d.hidden_size
        if d.fused_qkvz:
            self.in_proj_qkvz = Linear(h, 2 * d.key_dim + 2 * d.value_dim)
            self.in_proj_ba = Linear(h, 2 * d.num_v_heads)
        else:
            self.in_proj_qkv = Linear(h, d.conv_dim)
            self.in_proj_z = Linear(h, d.value_dim)
            self.in_proj_b = Linear(h, d.num_v_heads)
            self.in_proj_a = Linear(h, d.num_v_heads)
        self.conv1d = _Conv(d.conv_dim, d.conv_kernel)
        self.dt_bias = nn.Parameter(torch.ones(d.num_v_heads), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(d.num_v_heads), requires_grad=False)
        self.norm = _GatedNormWeight(d.head_v_dim)
        self.out_proj = Linear(d.value_dim, h, row_parallel=True)

    def project(self, x: torch.Tensor):
        """-> mixed qkv [T, conv_dim] (channels q | k | v, the conv's order), z [T, Hv, Dv], b, a [T, Hv]."""
        d, t = self.d, x.shape[0]
        if not d.fused_qkvz:
            z = self.in_proj_z(x).view(t, d.num_v_heads, d.head_v_dim)
            return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)
        # Qwen3-Next groups each key head with the value heads it serves: [q | k | v (r heads) | z (r heads)]
        r = d.group
        qkvz = self.in_proj_qkvz(x).view(t, d.num_k_heads, 2 * d.head_k_dim + 2 * r * d.head_v_dim)
        q, k, v, z = torch.split(qkvz, [d.head_k_dim, d.head_k_dim, r * d.head_v_dim, r * d.head_v_dim], -1)
        b, a = torch.split(self.in_proj_ba(x).view(t, d.num_k_heads, 2 * r), [r, r], -1)
        mixed = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], -1)
        return mixed, z.reshape(t, d.num_v_heads, d.head_v_dim), b.reshape(t, -1), a.reshape(t, -1)

    def recurrence_inputs(self, mixed, b, a, starts, lens, conv_state):
        """Conv + SiLU, l2-normed and scaled q, k (expanded to value heads), v, beta, log decay g; and the
        segments' conv windows (see causal_conv)."""
        d, t = self.d, mixed.shape[0]
        conv_out, windows = causal_conv(mixed, starts, lens, conv_state, self.conv1d.weight[:, 0, :])
        q, k, v = torch.split(conv_out.float(), [d.key_dim, d.key_dim, d.value_dim], -1)
        q = l2norm(q.reshape(t, d.num_k_heads, d.head_k_dim)) * d.head_k_dim ** -0.5
        k = l2norm(k.reshape(t, d.num_k_heads, d.head_k_dim))
        if d.group > 1:  # key head i serves value heads i*r .. i*r + r - 1
            q, k = q.repeat_interleave(d.group, 1), k.repeat_interleave(d.group, 1)
        v = v.reshape(t, d.num_v_heads, d.head_v_dim)
        beta = _rows(torch.sigmoid, b).float()  # transformers: in the model dtype
        g = -self.A_log.float().exp() * _rows(F.softplus, a.float() + self.dt_bias.float())
        return q, k, v, beta, g, windows

    def run(self, x: torch.Tensor, starts, lens, conv_state: torch.Tensor, rec_state: torch.Tensor,
            keep=(), chunked_min: int | None = None, keep_inputs=()):
        """The state interface. x: [T, hidden] packed rows; segment s is rows starts[s] .. + lens[s] with state
        (conv_state[s] [C, K-1], rec_state[s] [Hv, Dk, Dv] fp32). Returns (y [T, hidden], new conv states,
        new recurrent states, kept) where, for every segment index s in `keep`, kept[s] = (conv [L, C, K-1],
        recurrent [L, Hv, Dk, Dv]): the state after each of its rows; for s in `keep_inputs`, kept[s] = (mixed
        qkv [L, C], b [L, Hv], a [L, Hv]): what `replay` needs to rebuild the state after any prefix of those
        rows from the segment's initial state. Segments of at least `chunked_min` rows that are not kept use the
        chunked kernel (None: never)."""
        d, t = self.d, x.shape[0]
        starts, lens, keep, keep_inputs = list(starts), list(lens), set(keep), set(keep_inputs)
        mixed, z, b, a = self.project(x)
        q, k, v, beta, g, windows = self.recurrence_inputs(mixed, b, a, starts, lens, conv_state)

        chunked = [s for s, n in enumerate(lens) if chunked_min is not None and n >= chunked_min and s not in keep]
        rec = [s for s in range(len(lens)) if s not in chunked]
        out = torch.empty(t, d.num_v_heads, d.head_v_dim, dtype=torch.float32, device=x.device)
        new_rec = torch.empty_like(rec_state, dtype=torch.float32)
        inter_rec = {}
        if rec:
            rows = torch.cat([torch.arange(starts[s], starts[s] + lens[s]) for s in rec]).to(x.device)
            sub_starts = [sum(lens[r] for r in rec[:i]) for i in range(len(rec))]
            sub_lens = [lens[s] for s in rec]
            sel = torch.tensor(rec, device=x.device)
            o, st, inter = recurrent_gated_delta_rule(
                q[rows], k[rows], v[rows], _rows(torch.exp, g[rows]), beta[rows], sub_starts, sub_lens,
                rec_state.index_select(0, sel).float(), keep=[i for i, s in enumerate(rec) if s in keep])
            out.index_copy_(0, rows, o)
            new_rec.index_copy_(0, sel, st)
            inter_rec = {rec[i]: x_ for i, x_ in inter.items()}
        for s in chunked:
            sl = slice(starts[s], starts[s] + lens[s])
            out[sl], new_rec[s] = chunked_gated_delta_rule(q[sl], k[sl], v[sl], g[sl], beta[sl], rec_state[s])

        kk = d.conv_kernel
        new_conv = torch.stack([w[-(kk - 1):].T for w in windows]).to(conv_state.dtype) if windows \
            else conv_state.clone()
        kept = {s: (windows[s].unfold(0, kk - 1, 1)[1:].to(conv_state.dtype), inter_rec[s]) for s in keep}
        for s in keep_inputs:
            sl = slice(starts[s], starts[s] + lens[s])
            kept[s] = (mixed[sl], b[sl], a[sl])

        y = out.to(x.dtype).reshape(-1, d.head_v_dim)
        y = ops.rms_norm(y, self.norm.weight, d.eps)  # transformers: weight * normed.to(dtype), then the gate
        y = (y.float() * _rows(F.silu, z.reshape(-1, d.head_v_dim).float())).to(x.dtype)
        return self.out_proj(y.reshape(t, d.value_dim)), new_conv, new_rec, kept

    def replay(self, mixed, b, a, conv_state: torch.Tensor, rec_state: torch.Tensor):
        """The state after the rows (mixed, b, a from run's keep_inputs, first rows only) of ONE segment, from
        its initial (conv [C, K-1], recurrent [Hv, Dk, Dv]) state: conv, gates and recurrence, no projection and
        no output. The same per-row operations as run, hence the same bits as run's per-row states."""
        n = mixed.shape[0]
        q, k, v, beta, g, windows = self.recurrence_inputs(mixed, b, a, [0], [n], conv_state[None])
        _, st, _ = recurrent_gated_delta_rule(q, k, v, _rows(torch.exp, g), beta, [0], [n], rec_state[None].float())
        return windows[0][-(self.d.conv_kernel - 1):].T.to(conv_state.dtype), st[0]

    def forward(self, x: torch.Tensor, lb: "LinearBatch", pool: "LinearStatePool", ordinal: int):
        """Pool-backed step: read each segment's state from its slot, write the new state back unless the segment
        is a verify block (what `lb.rollback` asks to keep goes to lb.pending[ordinal] until the commit)."""
        conv, rec = pool.conv[ordinal], pool.rec[ordinal]
        slots = torch.tensor(lb.slots, device=x.device)
        verify = lb.keep_segments()
        y, nc, nr, kept = self.run(x, lb.starts, lb.lens, conv.index_select(0, slots), rec.index_select(0, slots),
                                   verify if lb.rollback == "states" else (), lb.chunked_min,
                                   verify if lb.rollback == "inputs" else ())
        write = [i for i in range(len(lb.slots)) if not lb.keep[i]]
        if write:
            w = torch.tensor(write, device=x.device)
            conv.index_copy_(0, slots[w], nc.index_select(0, w))
            rec.index_copy_(0, slots[w], nr.index_select(0, w))
        lb.pending[ordinal] = kept
        return y


class _GatedNormWeight(nn.Module):
    """linear_attn.norm: the gated RMSNorm's plain (not zero-centred) weight, initialised to ones."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)


@dataclass
class LinearBatch:
    """Per step, the linear-attention view of a packed batch: segment s (AttentionBatch.seqs order) is rows
    starts[s] .. + lens[s] and owns pool slot slots[s]; keep[s] marks a verify block, whose slot is left at the
    pre-verify state until the commit. rollback says what the verify pass keeps for it:
      "states"  the state after every row (vLLM / TensorRT-LLM); commit copies one: LinearStatePool.commit
      "inputs"  each linear layer's per-row conv input and gate logits; commit replays conv + recurrence over
                the accepted rows from the snapshot (HybridModel.commit): ~1/200 of the memory of "states"
      "none"    nothing: the caller runs the accepted rows through the whole model again (snapshot-and-replay)"""
    slots: list[int]
    starts: list[int]
    lens: list[int]
    keep: list[bool]
    chunked_min: int | None = None
    rollback: str = "states"
    pending: dict = field(default_factory=dict, repr=False)  # linear-layer ordinal -> {segment: (conv, rec)}

    @classmethod
    def from_attention(cls, batch, slots, keep=None, chunked_min=None) -> "LinearBatch":
        seqs = batch.seqs
        return cls(list(slots), [s.q_start for s in seqs], [s.q_len for s in seqs],
                   list(keep) if keep is not None else [False] * len(seqs), chunked_min)

    def keep_segments(self) -> list[int]:
        return [i for i, k in enumerate(self.keep) if k]


def choose_rollback(asked: str, state_bytes_per_request: int, max_batch_size: int, verify_rows: int,
                    kv_bytes: int) -> str:
    """LinearBatch.rollback for an engine: "states" (a copy at commit, the fastest) while the state after every
    row of a full batch of verify blocks takes at most a quarter of the KV cache's bytes, else "inputs" (a
    ~1/130 of that scratch, replayed at commit). Real models' 16-row DFlash blocks need ~1 GiB of "states"
    scratch per verifying request (docs/hybrid.md); a tiny CPU model needs little."""
    if asked != "auto":
        return asked
    return "states" if max_batch_size * verify_rows * state_bytes_per_request <= kv_bytes // 4 else "inputs"


class LinearStatePool:
    """Every linear-attention layer's state for `slots` sequences: conv [layers, slots, C, K-1] in the model
    dtype, recurrent [layers, slots, Hv, Dk, Dv] in fp32 (the delta rule's precision in transformers and FLA)."""

    def __init__(self, d: DeltaNetDims, n_layers: int, slots: int, dtype=torch.float32, device="cpu"):
        self.d = d
        self.conv = torch.zeros(n_layers, slots, *d.conv_state_shape(), dtype=dtype, device=device)
        self.rec = torch.zeros(n_layers, slots, *d.recurrent_state_shape(), dtype=torch.float32, device=device)

    def clear(self, slot: int) -> None:
        """A new sequence starts from zero state (transformers' fresh cache)."""
        self.conv[:, slot].zero_()
        self.rec[:, slot].zero_()

    def commit(self, lb: LinearBatch, segment: int, rows: int) -> None:
        """Keep the first `rows` rows (>= 1) of verify segment `segment`: its slot gets the state after row
        rows - 1 in every layer. rows == 0 leaves the pre-verify state."""
        if rows == 0:
            return
        if lb.rollback != "states":
            raise ValueError(f"LinearStatePool.commit copies kept states; rollback {lb.rollback!r} commits "
                             "through HybridModel.commit")
        slot = lb.slots[segment]
        for ordinal, per_seg in lb.pending.items():
            conv, rec = per_seg[segment]
            self.conv[ordinal, slot] = conv[rows - 1]
            self.rec[ordinal, slot] = rec[rows - 1]

    def bytes_per_slot(self) -> int:
        return (self.conv[:, 0].numel() * self.conv.element_size() + self.rec[:, 0].numel() * 4)
