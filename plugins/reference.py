"""Pure-PyTorch reference versions of the DFlash custom ops: the test oracle for the C++ and CUDA kernels.

Self-contained on purpose (the plugins sit below the runtime in the dependency order): the Philox sampler and
`filtered_probs` are restated here, and tests/test_plugin_ops.py proves them equal to `dflash_trt.sampling`.
Slow, loop-per-request code: clarity over speed. Every function takes and returns what the op of the same
name in `dflash_ops` takes and returns (context_append mutates the caches in place).

Conventions shared by all ops (see dflash_ops.py for the full contract):
- a ragged batch of R requests; request r owns logits rows row_offsets[r] .. row_offsets[r] + K_r
  (K_r = draft_lens[r] drafts, plus the bonus row);
- padding value -1 in every index output;
- all index outputs are int64.
"""
from __future__ import annotations

import torch

PAD = -1

# ---------------------------------------------------------------------------------------------- sampling maths
_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
_MASK = 0xFFFFFFFF


def philox4x32(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Philox-4x32-10. counter: [N, 4], key: [N, 2], int64 holding uint32 values. Returns [N, 4]."""
    c0, c1, c2, c3 = (counter[:, i].clone() for i in range(4))
    k0, k1 = key[:, 0].clone(), key[:, 1].clone()
    for _ in range(10):
        p0, p1 = c0 * _M0, c2 * _M1  # the low 64 bits of the products are exact in wrapping int64
        hi0, lo0 = (p0 >> 32) & _MASK, p0 & _MASK
        hi1, lo1 = (p1 >> 32) & _MASK, p1 & _MASK
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    return torch.stack([c0, c1, c2, c3], 1)


def uniforms(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One float64 uniform in [0, 1) per (seed, position): key = seed as 2x32 bits, counter = (pos lo, pos hi,
    0, 0), 53 bits of the first two output words."""
    seeds, positions = seeds.to(torch.int64).reshape(-1), positions.to(torch.int64).reshape(-1)
    counter = torch.stack([positions & _MASK, (positions >> 32) & _MASK,
                           torch.zeros_like(positions), torch.zeros_like(positions)], 1)
    key = torch.stack([seeds & _MASK, (seeds >> 32) & _MASK], 1)
    r = philox4x32(counter, key)
    bits53 = (r[:, 0] << 21) | (r[:, 1] >> 11)
    return bits53.to(torch.float64) * (2.0 ** -53)


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                   stable: bool = False) -> torch.Tensor:
    """Temperature, then top-k (ties with the k-th value kept), then top-p (smallest prefix of the sorted
    distribution whose mass reaches top_p), float64, rows sum to 1. Equal probabilities at the top-p cut are
    ordered by torch's (unstable) sort, as dflash_trt.sampling does; stable=True orders them by index, as the
    CUDA kernel does."""
    scores = logits.double() / temperature
    vocab = scores.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        sp, order = probs.sort(dim=-1, descending=True, stable=True) if stable else probs.sort(dim=-1, descending=True)
        keep = (sp.cumsum(-1) - sp) < top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sp * keep)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_one(logits_row: torch.Tensor, temperature: float, top_k: int, top_p: float, seed: int,
               position: int, u: float | None = None, stable: bool = False) -> int:
    """The token at absolute `position` drawn from one row of logits (argmax when temperature == 0).
    u: the row's uniform when already computed (uniforms() batches well); stable: see filtered_probs."""
    if temperature == 0:
        return int(torch.argmax(logits_row))
    probs = filtered_probs(logits_row[None], temperature, top_k, top_p, stable)[0]
    if u is None:
        u = float(uniforms(torch.tensor([seed]), torch.tensor([position]))[0])
    cdf = probs.cumsum(0)
    tok = int(torch.searchsorted(cdf, u * cdf[-1], right=True))
    return min(tok, probs.shape[0] - 1)


# ------------------------------------------------------------------------------------------------------ ops
def prepare_draft_blocks(last_tokens: torch.Tensor, starts: torch.Tensor, block_tables: torch.Tensor,
                         block_size: int, mask_token_id: int, page_size: int, num_ctx_slots: int):
    """Returns (block_ids [R*B], positions [R*B], ctx_slots [num_ctx_slots], ctx_offsets [R+1]).

    Request r's block is [last_tokens[r], MASK x (B-1)] at positions starts[r] .. starts[r]+B-1; its context
    positions 0 .. starts[r]-1 map to slots ctx_slots[ctx_offsets[r] : ctx_offsets[r+1]], slot =
    table[pos // page] * page + pos % page. Entries past ctx_offsets[R] are -1.
    """
    dev = last_tokens.device
    r_n, b = last_tokens.shape[0], block_size
    ids = torch.full((r_n, b), mask_token_id, dtype=torch.int64, device=dev)
    ids[:, 0] = last_tokens.to(torch.int64)
    st = starts.to(torch.int64)
    positions = st[:, None] + torch.arange(b, device=dev)[None, :]
    offsets = torch.zeros(r_n + 1, dtype=torch.int64, device=dev)
    offsets[1:] = torch.cumsum(st, 0)
    slots = torch.full((num_ctx_slots,), PAD, dtype=torch.int64, device=dev)
    if int(offsets[-1]) > num_ctx_slots:
        raise ValueError(f"num_ctx_slots={num_ctx_slots} < total context length {int(offsets[-1])}")
    bt = block_tables.to(torch.int64)
    for r in range(r_n):
        n, o = int(st[r]), int(offsets[r])
        pos = torch.arange(n, device=dev)
        slots[o:o + n] = bt[r, pos // page_size] * page_size + pos % page_size
    return ids.reshape(-1), positions.reshape(-1), slots, offsets


def _accept(drafts: torch.Tensor, draft_lens: torch.Tensor, row_offsets: torch.Tensor, choice: torch.Tensor):
    r_n, k_max = drafts.shape
    dev = drafts.device
    accepted = torch.zeros(r_n, dtype=torch.int64, device=dev)
    committed = torch.full((r_n, k_max + 1), PAD, dtype=torch.int64, device=dev)
    lens, offs, ch, dr = draft_lens.tolist(), row_offsets.tolist(), choice.tolist(), drafts.tolist()
    for r in range(r_n):
        k, o = lens[r], offs[r]
        d = dr[r][:k]
        post = ch[o:o + k + 1]
        a = 0
        while a < k and d[a] == post[a]:
            a += 1
        accepted[r] = a
        committed[r, :a + 1] = torch.tensor(d[:a] + [post[a]], dtype=torch.int64)
    return accepted, committed, accepted + 1


def greedy_verify(drafts: torch.Tensor, draft_lens: torch.Tensor, logits: torch.Tensor,
                  row_offsets: torch.Tensor):
    """Returns (argmax [N], accepted [R], committed [R, Kmax+1] padded with -1, num_committed [R])."""
    choice = torch.argmax(logits, dim=-1).to(torch.int64)
    return (choice,) + _accept(drafts, draft_lens, row_offsets, choice)


def row_owners(draft_lens: torch.Tensor, row_offsets: torch.Tensor, n_rows: int) -> list[tuple[int, int]]:
    """(request, row-in-request) per logits row, (-1, -1) for rows no request owns; the first owner wins."""
    own = [(-1, -1)] * n_rows
    lens, offs = draft_lens.tolist(), row_offsets.tolist()
    for r in range(len(lens)):
        o, k = offs[r], lens[r]
        for j in range(k + 1):
            if 0 <= o + j < n_rows and own[o + j][0] < 0:
                own[o + j] = (r, j)
    return own


def sampling_verify(drafts: torch.Tensor, draft_lens: torch.Tensor, logits: torch.Tensor,
                    row_offsets: torch.Tensor, starts: torch.Tensor, seeds: torch.Tensor,
                    temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
    """Returns (sampled [N], accepted [R], committed [R, Kmax+1], num_committed [R]).

    Row j of request r samples the token at position starts[r] + j + 1 with the request's parameters
    (argmax when its temperature is 0); rows no request owns get their argmax.
    """
    n = logits.shape[0]
    choice = torch.argmax(logits, dim=-1).to(torch.int64).cpu() if n else torch.zeros(0, dtype=torch.int64)
    temps, tks, tps = temperature.tolist(), top_k.tolist(), top_p.tolist()
    sds, sts = seeds.tolist(), starts.tolist()
    rows = [(i, r, j) for i, (r, j) in enumerate(row_owners(draft_lens, row_offsets, n)) if r >= 0 and temps[r] != 0]
    if rows:
        u = uniforms(torch.tensor([sds[r] for _, r, _ in rows]),
                     torch.tensor([sts[r] + j + 1 for _, r, j in rows])).tolist()
        for (i, r, j), ui in zip(rows, u):
            choice[i] = sample_one(logits[i].cpu(), temps[r], int(tks[r]), tps[r], sds[r], sts[r] + j + 1, ui)
    choice = choice.to(logits.device)
    return (choice,) + _accept(drafts, draft_lens, row_offsets, choice)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Same arithmetic as dflash_trt.ops.rms_norm: float32 statistics, cast back, then the weight."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE; x: [T, heads, D], cos/sin: [T, D] rows for each row's position."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def context_append(k: torch.Tensor, v: torch.Tensor, k_norm_weight: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   eps: float) -> None:
    """k, v: [T, KVH, D] pre-norm projections; caches [num_blocks, page, KVH, D]; rows with slot < 0 skipped."""
    kvh, d = k_cache.shape[-2:]
    kr = apply_rope(rms_norm(k, k_norm_weight, eps), cos, sin)
    keep = slots >= 0
    idx = slots[keep].to(torch.int64)
    k_cache.view(-1, kvh, d).index_copy_(0, idx, kr[keep].to(k_cache.dtype))
    v_cache.view(-1, kvh, d).index_copy_(0, idx, v[keep].to(v_cache.dtype))
