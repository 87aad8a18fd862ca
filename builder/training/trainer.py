"""Stage 2 of training: the DFlash recipe (dflash.md section 4) on cached target features.

Per sequence: anchors a are committed positions of the response; block a is [x_a, MASK x (B-1)] at positions
a..a+B-1; its queries see context rows strictly before a and every row of their own block (bidirectional),
nothing of other blocks; row k is trained on x_{a+k} (same position) with weight exp(-(k-1)/gamma), or with
D-PACE weights (dpace_weights) that follow the drafter's own confidence in the block's earlier rows.
Only fc, hidden_norm, the layers and norm train; the target's embedding and head are frozen.

On a CPU the frozen head dominates a step (49K rows for SmolLM2), so training scores only the head rows of
tokens the training labels use (`label_vocab`): self-distilled answers use a few thousand distinct tokens. The
held-out tau drafts from those rows too, as decoding does with the exported draft_vocab.json.

The loss over the head is computed in row chunks (linear_cross_entropy): a [rows, vocab] logits tensor of a real
target (152K rows for Qwen3) would be the largest activation of the step. Features come from the offline cache
(features.py) or from the target run in the loop (online.py); data parallelism (distributed.py) splits each
global batch over the ranks, which all draw it from the same random state.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import signal
import threading
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...rope import apply_rope

GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def position_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    g = gamma or GAMMA.get(block_size, block_size / 2)
    return torch.exp(-torch.arange(block_size - 1, dtype=torch.float32) / g)


def dpace_weights(ce: torch.Tensor, valid: torch.Tensor, alpha: float) -> torch.Tensor:
    """D-PACE position weights [N, K] (no gradient) from the rows' cross-entropy [N, K]: with the confidence
    q_k = exp(-ce_k) smoothed to alpha + (1 - alpha) q_k, C_k is the product of the smoothed confidences of rows
    1..k (the chance the draft survives to row k) and row k weighs sum_{m >= k} C_m, the expected accepted length
    the rows from k on still hold. Rows without a label count as certain and weigh nothing."""
    with torch.no_grad():
        q = torch.where(valid, alpha + (1.0 - alpha) * torch.exp(-ce.float()), torch.ones_like(ce, dtype=torch.float32))
        c = torch.cumprod(q, -1) * valid
        return c.flip(-1).cumsum(-1).flip(-1)


def block_attention_mask(anchors: torch.Tensor, ctx_len: int, block_size: int) -> torch.Tensor:
    """[N*B, ctx_len + N*B] bool: row of block n sees context j < a_n and all rows of block n."""
    n = anchors.numel()
    blk = torch.arange(n, device=anchors.device).repeat_interleave(block_size)
    ctx = torch.arange(ctx_len, device=anchors.device)[None, :] < anchors.repeat_interleave(block_size)[:, None]
    own = blk[:, None] == blk[None, :]
    return torch.cat([ctx, own], dim=1)


def block_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor,
                    anchors: torch.Tensor, block_size: int, scale: float) -> torch.Tensor:
    """Attention under block_attention_mask without materialising the [N*B, N*B] block part: each row scores
    the context (masked to j < its anchor) and only its own block's B keys, one softmax over both. The dense
    masked form spends ~N times the work on keys of other blocks that the mask then throws away.
    q: [N*B, H, D]; kc, vc: [T, KVH, D] context; kb, vb: [N*B, KVH, D] block rows. Returns [N*B, H, D]."""
    nb, h, d = q.shape
    t, kvh = kc.shape[0], kc.shape[1]
    g, n = h // kvh, nb // block_size
    qh = q.reshape(nb, kvh, g, d).permute(1, 2, 0, 3)  # [KVH, G, NB, D]
    s_ctx = torch.einsum("kgrd,tkd->kgrt", qh, kc) * scale
    visible = torch.arange(t, device=q.device)[None, :] < anchors.repeat_interleave(block_size)[:, None]  # [NB, T]
    s_ctx = s_ctx.masked_fill(~visible, float("-inf"))
    qb = qh.reshape(kvh, g, n, block_size, d)
    kbb = kb.reshape(n, block_size, kvh, d).permute(2, 0, 1, 3)  # [KVH, N, B, D]
    vbb = vb.reshape(n, block_size, kvh, d).permute(2, 0, 1, 3)
    s_blk = torch.einsum("kgnbd,kncd->kgnbc", qb, kbb).reshape(kvh, g, nb, block_size) * scale
    p = torch.softmax(torch.cat([s_ctx, s_blk], -1), -1)
    o = torch.einsum("kgrt,tkd->kgrd", p[..., :t], vc)
    o = o + torch.einsum("kgnbc,kncd->kgnbd", p[..., t:].reshape(kvh, g, n, block_size, block_size),
                         vbb).reshape(kvh, g, nb, d)
    return o.permute(2, 0, 1, 3).reshape(nb, h, d)


def block_labels(ids: torch.Tensor, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """[N, B-1]: row k of block n predicts x_{a_n + k}; -100 past the end of the sequence."""
    idx = anchors[:, None] + torch.arange(1, block_size, device=anchors.device)[None, :]
    return torch.where(idx < ids.numel(), ids[idx.clamp(max=ids.numel() - 1)], torch.full_like(idx, -100))


def choose_anchors(prompt_len: int, length: int, n: int, gen: torch.Generator | None) -> torch.Tensor:
    """Anchors are generated tokens (the first block's bonus is the first answer token) with a next token."""
    lo, hi = prompt_len, length - 1
    if hi <= lo:
        return torch.zeros(0, dtype=torch.long)
    cand = torch.arange(lo, hi)
    if cand.numel() <= n:
        return cand
    return cand[torch.randperm(cand.numel(), generator=gen)[:n]].sort().values


def draft_rows(drafter, embed_w: torch.Tensor, ids: torch.Tensor, feats: torch.Tensor,
               anchors: torch.Tensor) -> torch.Tensor:
    """Differentiable drafter forward for all blocks of one sequence; returns normed hidden [N, B-1, H]."""
    cfg = drafter.cfg
    b, n, t, dev = cfg.block_size, anchors.numel(), ids.numel(), ids.device
    c = drafter.project_context(feats.to(embed_w.dtype))
    blk_ids = torch.full((n, b), cfg.mask_token_id, dtype=torch.long, device=dev)
    blk_ids[:, 0] = ids[anchors]
    x = F.embedding(blk_ids.flatten(), embed_w) * cfg.input_embedding_scale
    pos_b = (anchors[:, None] + torch.arange(b, device=dev)[None, :]).flatten()
    cos_c, sin_c = drafter.rotary(torch.arange(t, device=dev), x.dtype)
    cos_b, sin_b = drafter.rotary(pos_b, x.dtype)
    for layer in drafter.layers:
        att = layer.self_attn
        h = layer.input_layernorm(x)
        q = apply_rope(att.q_norm(att.q_proj(h).view(n * b, -1, att.head_dim)), cos_b, sin_b)
        kb, vb = att.kv(h, cos_b, sin_b)
        kc, vc = att.kv(c, cos_c, sin_c)
        o = block_attention(q, kc, vc, kb, vb, anchors, b, att.scale)
        x = x + att.o_proj(o.reshape(n * b, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return drafter.norm(x).view(n, b, -1)[:, 1:]


CE_CHUNK_ELEMENTS = 1 << 26  # logits held at once by linear_cross_entropy (256 MiB in float32)


def _chunk_rows(vocab: int, chunk: int | None) -> int:
    return chunk or max(1, CE_CHUNK_ELEMENTS // vocab)


def _ce_chunk(h: torch.Tensor, head_w: torch.Tensor, labels: torch.Tensor, mult: float, grad: bool):
    """(ce, argmax, d ce / d h or None) of one chunk of rows; logits in float32 at least, never kept."""
    logits = F.linear(h.to(head_w.dtype), head_w)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) * mult  # bf16 heads: float32 softmax
    valid = labels != -100
    lab = labels.clamp(min=0)
    lse = torch.logsumexp(logits, -1)
    ce = torch.where(valid, lse - logits.gather(1, lab[:, None])[:, 0], torch.zeros_like(lse))
    pred = logits.argmax(-1)
    dh = None
    if grad:  # softmax - onehot, through the head: the gradient of each row's ce with respect to its hidden row
        p = torch.softmax(logits, -1)
        p[torch.arange(p.shape[0], device=p.device), lab] -= 1.0
        p.mul_(mult).mul_(valid[:, None])
        dh = (p.to(head_w.dtype) @ head_w).to(h.dtype)
    return ce, pred, dh


class _LinearCE(torch.autograd.Function):
    """Row-wise cross-entropy of hidden @ head.T against labels, in chunks of rows. The gradient of each row is
    computed with its chunk in the forward (the head is frozen, so d/dh is all backward needs) and scaled by the
    incoming gradient in the backward: the [rows, vocab] logits exist one chunk at a time, in neither pass in
    full (what fused linear-cross-entropy kernels do, in plain torch)."""

    @staticmethod
    def forward(ctx, hidden, head_w, labels, mult, chunk):
        ces, preds, dhs = [], [], []
        for i in range(0, hidden.shape[0], chunk):
            ce, pred, dh = _ce_chunk(hidden[i:i + chunk], head_w, labels[i:i + chunk], mult, True)
            ces.append(ce)
            preds.append(pred)
            dhs.append(dh)
        ctx.save_for_backward(torch.cat(dhs))
        pred = torch.cat(preds)
        ctx.mark_non_differentiable(pred)
        return torch.cat(ces), pred

    @staticmethod
    def backward(ctx, grad_ce, _grad_pred):
        (dh,) = ctx.saved_tensors
        return (grad_ce[:, None] * dh).to(dh.dtype), None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, head_w: torch.Tensor, labels: torch.Tensor, mult: float = 1.0,
                         chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-row cross-entropy [R] float32, argmax [R]) of logits = hidden @ head_w.T * mult, rows with label -100
    scoring 0; chunk: rows per chunk (default: CE_CHUNK_ELEMENTS logits)."""
    chunk = _chunk_rows(head_w.shape[0], chunk)
    if torch.is_grad_enabled() and hidden.requires_grad:
        return _LinearCE.apply(hidden, head_w, labels, mult, chunk)
    out = [_ce_chunk(hidden[i:i + chunk], head_w, labels[i:i + chunk], mult, False)
           for i in range(0, hidden.shape[0], chunk)]
    return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])


def block_loss(hidden: torch.Tensor, labels: torch.Tensor, head_w: torch.Tensor, weights: torch.Tensor | None,
               output_multiplier: float = 1.0, chunk: int | None = None, dpace_alpha: float | None = None):
    """Weighted same-position cross-entropy; also returns per-row correctness for acceptance estimates.
    weights: fixed per-position weights; dpace_alpha: D-PACE weights from each block's own rows instead."""
    n, k, hdim = hidden.shape
    ce, pred = linear_cross_entropy(hidden.reshape(-1, hdim), head_w, labels.reshape(-1), output_multiplier, chunk)
    ce = ce.view(n, k)
    valid = labels != -100
    if dpace_alpha is not None:
        w = dpace_weights(ce.detach(), valid, dpace_alpha)
    else:
        w = weights.to(ce.device)[None, :k] * valid.float()
    loss = (ce * w).sum() / w.sum().clamp(min=1e-6)
    correct = (pred.view(n, k) == labels) & (labels != -100)
    return loss, correct


def plain_block_loss(hidden, labels, head_w, weights, output_multiplier: float = 1.0):
    """block_loss with the whole [rows, vocab] logits tensor: the reference the chunked loss is tested against."""
    n, k, hdim = hidden.shape
    logits = F.linear(hidden.reshape(-1, hdim), head_w) * output_multiplier
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    ce = F.cross_entropy(logits, labels.reshape(-1), ignore_index=-100, reduction="none").view(n, k)
    w = weights[None, :k] * (labels != -100).float()
    return (ce * w).sum() / w.sum().clamp(min=1e-6)


def label_vocab(seqs: list[dict], vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids any training label can take (the responses) and a full-vocab -> subset index table."""
    used = torch.zeros(vocab_size, dtype=torch.bool)
    for s in seqs:
        used[s["ids"][s["prompt_len"]:]] = True
    vocab = used.nonzero().flatten()
    lut = torch.full((vocab_size,), -100, dtype=torch.long)
    lut[vocab] = torch.arange(vocab.numel())
    return vocab, lut


def to_subset(labels: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    return torch.where(labels == -100, labels, lut[labels.clamp(min=0)])


def accepted_lengths(correct: torch.Tensor, k: int) -> torch.Tensor:
    """Leading run of correct drafts among the first k rows (greedy acceptance under teacher forcing)."""
    return correct[:, :k].int().cumprod(1).sum(1)


@dataclass
class TrainConfig:
    block_size: int = 8
    anchors_per_seq: int = 48
    seqs_per_step: int = 4
    lr: float = 6e-4
    warmup_frac: float = 0.04
    max_steps: int = 2000
    time_budget_min: float | None = None  # total training minutes over all resumes
    session_min: float | None = None  # minutes in this invocation (a driver restarts it to pick up new data)
    clip: float = 1.0
    weight_decay: float = 0.0
    eval_every: int = 200
    save_every: int = 100
    seed: int = 0
    full_head: bool = False  # score all vocabulary rows in training, not only the tokens labels use
    log_every: int = 10
    loss_weights: str = "exp"  # exp: exp(-(k-1)/gamma); dpace: dpace_weights
    gamma: float | None = None  # None: GAMMA of the block size
    dpace_alpha: float = 0.5
    schedule: str = "cosine"  # cosine: warmup then cosine to 0; wsd: warmup, constant, linear decay to 0
    decay_frac: float = 0.2  # wsd: the last decay_frac of max_steps decay
    autocast: str | None = None  # "bf16" or "float32"; None: bf16 on a GPU, float32 on a CPU


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The learning rate of step `step` (0-based). wsd decays linearly from the full rate at step
    max_steps - D to lr / D at the last step, D = decay_frac * max_steps: the cooldown ends the schedule, so a
    run stopped there is ready to ship."""
    warm = max(1, int(cfg.warmup_frac * cfg.max_steps))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    if getattr(cfg, "schedule", "cosine") == "wsd":
        decay = max(1, int(round(cfg.decay_frac * cfg.max_steps)))
        return cfg.lr * min(1.0, max(0.0, (cfg.max_steps - step) / decay))
    p = min(1.0, (step - warm) / max(1, cfg.max_steps - warm))
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * p))


def autocast(device, dtype: str | None = None):
    """bfloat16 autocast of the drafter's forward (its master weights stay float32 for AdamW). dtype None: on a
    GPU, and not on a CPU, whose float32 results the tests pin; "bf16" / "float32" ask for it on any device."""
    device = torch.device(device)
    if dtype is None:
        dtype = "bf16" if device.type == "cuda" else "float32"
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def decode_anchors(runs: torch.Tensor) -> list[int]:
    """The blocks greedy decoding visits. runs[i] is the accepted length of the block anchored at the i-th answer
    position (consecutive anchors from the first answer token); decoding anchors its next block right after the
    bonus token, so it visits only blocks that follow a rejection. Those sit after a token the drafter got wrong
    and are harder than average: tau along this path is what decoding measures (the drafts are the engine's,
    tests/test_train.py), tau over uniform anchors overstates it."""
    out, i, runs = [], 0, runs.tolist()
    while i < len(runs):
        out.append(i)
        i += runs[i] + 1
    return out


@torch.no_grad()
def evaluate_counts(drafter, embed_w, head_w, seqs: list[dict], max_draft_len: int, anchors_per_seq: int = 256,
                    vocab: torch.Tensor | None = None, loss: bool = True) -> list[dict]:
    """evaluate's sums for each sequence (None where it has no anchor): anchors, accepted drafts over them, loss
    sum, and the steps and tokens of decoding's walk (0 when the sequence has more than anchors_per_seq
    candidates). Groups of sequences add up; loss=False skips the full-head loss (the costliest part) when only
    acceptance is wanted and drafts come from `vocab`."""
    out, dev = [], embed_w.device
    vocab = vocab.to(dev) if vocab is not None else None
    vocab_head = head_w[vocab] if vocab is not None else None
    for s in seqs:
        anchors = choose_anchors(s["prompt_len"], s["ids"].numel(), anchors_per_seq, torch.Generator().manual_seed(0))
        if anchors.numel() == 0:
            out.append(None)
            continue
        ids, anchors = s["ids"].to(dev), anchors.to(dev)
        with autocast(dev):
            h = draft_rows(drafter, embed_w, ids, s["features"].to(dev), anchors)
        labels = block_labels(ids, anchors, drafter.cfg.block_size)
        loss_sum = 0.0
        if loss or vocab is None:
            lv, correct = block_loss(h, labels, head_w, position_weights(drafter.cfg.block_size),
                                     drafter.cfg.output_multiplier)
            loss_sum = lv.item() * anchors.numel()
        if vocab is not None:
            # output_multiplier > 0 cannot move an argmax
            pred = vocab[(h.to(vocab_head.dtype) @ vocab_head.T).argmax(-1)]
            correct = (pred == labels) & (labels != -100)
        runs = accepted_lengths(correct, max_draft_len)
        c = {"anchors": anchors.numel(), "accepted": runs.float().sum().item(), "loss_sum": loss_sum,
             "decode_steps": 0, "decode_tokens": 0}
        if anchors.numel() == s["ids"].numel() - 1 - s["prompt_len"]:  # every anchor
            visited = decode_anchors(runs)
            c["decode_steps"], c["decode_tokens"] = len(visited), int(runs[visited].sum()) + len(visited)
        out.append(c)
    return out


def taus(counts: list[dict | None]) -> tuple[float, float, float]:
    """(tau, loss, decode tau) of a group of evaluate_counts entries."""
    cs = [c for c in counts if c]
    n, steps = sum(c["anchors"] for c in cs), sum(c["decode_steps"] for c in cs)
    return (1.0 + sum(c["accepted"] for c in cs) / max(n, 1), sum(c["loss_sum"] for c in cs) / max(n, 1),
            sum(c["decode_tokens"] for c in cs) / max(steps, 1))


def evaluate(drafter, embed_w, head_w, seqs: list[dict], max_draft_len: int, anchors_per_seq: int = 256,
             vocab: torch.Tensor | None = None):
    """Held-out (tau, loss, decode tau) at draft length max_draft_len, greedy, teacher-forced; drafts are chosen
    among the `vocab` rows of the head when given, as our runtime does with a draft_vocab.json. tau averages
    over random anchors (the training distribution); decode tau follows decoding's own anchors (decode_anchors),
    which needs every anchor: a sequence with more than anchors_per_seq candidates is left out of it."""
    return taus(evaluate_counts(drafter, embed_w, head_w, seqs, max_draft_len, anchors_per_seq, vocab))


def anchor_generator(seed: int, step: int, item: int) -> torch.Generator:
    """The anchors of item `item` of step `step`'s global batch: a function of the three numbers, so a rank draws
    the same anchors for a sequence as a single process would, and a resumed run the same as an unbroken one."""
    key = hashlib.sha256(f"dflash-anchors|{seed}|{step}|{item}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(key[:8], "big") >> 1)


def cached_features(seqs: list[dict]) -> list[torch.Tensor]:
    """The features of sequences loaded from the offline cache (features.load_shard)."""
    return [s["features"] for s in seqs]


class Trainer:
    """features: sequences -> their target features (cached_features, or online.OnlineFeatures running the
    target); dist: a distributed.Group under torchrun. Every rank draws the same global batch of
    cfg.seqs_per_step sequences from the same random state and trains items rank, rank + world, ...; gradients are
    summed over the ranks, so a step is the single-process step over the same batch."""

    def __init__(self, drafter, embed_w, head_w, train_seqs: list[dict], cfg: TrainConfig, out_dir: str,
                 log=print, features=None, dist=None):
        from ...errors import DFlashError

        self.dist = dist
        self.rank, self.world = (dist.rank, dist.world) if dist is not None else (0, 1)
        if cfg.seqs_per_step % self.world:
            raise DFlashError(f"--seqs-per-step {cfg.seqs_per_step} does not split over {self.world} ranks: give a "
                              f"multiple of {self.world}")
        self.dev = embed_w.device
        self.d, self.embed_w, self.head_w = drafter.to(self.dev), embed_w, head_w
        drafter.rotary.to(self.dev)
        self.seqs, self.cfg, self.out = train_seqs, cfg, out_dir
        self.log = log if self.rank == 0 else (lambda *_: None)
        self.features = features or cached_features
        for p in drafter.parameters():
            p.requires_grad_(True)
        self.params = [p for p in drafter.parameters()]
        if dist is not None:
            dist.broadcast(self.params)
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.step, self.elapsed, self.history = 0, 0.0, []
        self.weights = position_weights(drafter.cfg.block_size, cfg.gamma).to(self.dev)
        self.dpace_alpha = cfg.dpace_alpha if cfg.loss_weights == "dpace" else None
        self.rng = random.Random(cfg.seed)
        self.lut = self.vocab = None  # vocab: what the exported draft_vocab.json holds (decoding drafts from it)
        if not cfg.full_head:
            self.vocab, self.lut = label_vocab(train_seqs, head_w.shape[0])
            self.train_head = head_w[self.vocab.to(self.dev)].contiguous()
            self.lut = self.lut.to(self.dev)
            self.log(f"training loss over {self.vocab.numel()} of {head_w.shape[0]} vocabulary rows "
                     "(tokens the labels use)")
        else:
            self.train_head = head_w

    # -- checkpoints ------------------------------------------------------------------------------
    def state_path(self) -> str:
        return os.path.join(self.out, "trainer_state.pt")

    def save(self, export) -> None:
        """Rank 0 writes; the others hold the same weights and state."""
        if self.rank != 0:
            return
        os.makedirs(self.out, exist_ok=True)
        tmp = self.state_path() + ".tmp"
        torch.save({"step": self.step, "elapsed": self.elapsed, "history": self.history,
                    "model": self.d.state_dict(), "opt": self.opt.state_dict(), "rng": self.rng.getstate(),
                    "world": self.world}, tmp)
        os.replace(tmp, self.state_path())
        export(self.d)

    def resume(self) -> bool:
        if not os.path.isfile(self.state_path()):
            return False
        st = torch.load(self.state_path(), weights_only=False, map_location="cpu")
        self.d.load_state_dict(st["model"])
        self.opt.load_state_dict(st["opt"])
        self.step, self.elapsed, self.history = st["step"], st["elapsed"], st["history"]
        self.rng.setstate(st["rng"])
        self.log(f"resumed at step {self.step} ({self.elapsed / 60:.1f} min of training)")
        return True

    # -- the loop ---------------------------------------------------------------------------------
    def train_step(self) -> tuple[float, int, int]:
        """One optimizer step; returns (loss, label rows, sequence tokens) over the global batch."""
        cfg, g = self.cfg, self.cfg.seqs_per_step
        for grp in self.opt.param_groups:
            grp["lr"] = lr_at(self.step, cfg)
        self.opt.zero_grad(set_to_none=True)
        batch = [self.rng.randrange(len(self.seqs)) for _ in range(g)]  # the same on every rank
        mine = list(range(self.rank, g, self.world))
        seqs = [self.seqs[batch[j]] for j in mine]
        feats = self.features(seqs)
        total = torch.zeros((), device=self.dev)
        rows = tokens = 0
        for j, s, f in zip(mine, seqs, feats):
            tokens += s["ids"].numel()
            anchors = choose_anchors(s["prompt_len"], s["ids"].numel(), cfg.anchors_per_seq,
                                     anchor_generator(cfg.seed, self.step, j))
            if anchors.numel() == 0:
                continue
            ids, anchors = s["ids"].to(self.dev), anchors.to(self.dev)
            with autocast(self.dev, cfg.autocast):
                h = draft_rows(self.d, self.embed_w, ids, f.to(self.dev), anchors)
            labels = block_labels(ids, anchors, self.d.cfg.block_size)
            rows += int((labels != -100).sum())
            if self.lut is not None:
                labels = to_subset(labels, self.lut)
            loss, _ = block_loss(h, labels, self.train_head, self.weights, self.d.cfg.output_multiplier,
                                 dpace_alpha=self.dpace_alpha)
            (loss / g).backward()
            total += loss.detach() / g
        if self.dist is not None:
            self.dist.sum_grads(self.params)
            total, rows, tokens = self.dist.sum_values([total.item(), rows, tokens])
        else:
            total = total.item()
        torch.nn.utils.clip_grad_norm_(self.params, cfg.clip)
        self.opt.step()
        self.step += 1
        return total, int(rows), int(tokens)

    def run(self, export, eval_seqs: list[dict] | None = None, max_draft_len: int | None = None,
            progress: bool = False) -> int | None:
        """Train to the end of the schedule or budget; returns the number of the signal that stopped it early
        (after saving), else None. Rank 0 evaluates, logs and saves. progress: a tqdm bar (rank 0)."""
        cfg = self.cfg
        k = max_draft_len or self.d.cfg.block_size - 1
        budget = cfg.time_budget_min * 60 if cfg.time_budget_min else None
        session_end = time.time() + cfg.session_min * 60 if cfg.session_min else None
        if self.rank != 0:
            eval_seqs = None
        if eval_seqs and any("features" not in s for s in eval_seqs):  # online: computed once, kept
            eval_seqs = [dict(s, features=f.cpu()) for s, f in zip(eval_seqs, self.features(eval_seqs))]
        self.bar = None
        if progress and self.rank == 0:
            from tqdm import tqdm
            self.bar = tqdm(total=cfg.max_steps, initial=self.step, unit="step", dynamic_ncols=True)

        def record(train_loss):
            tau, loss, tau_decode = evaluate(self.d, self.embed_w, self.head_w, eval_seqs, k, vocab=self.vocab)
            self.history.append({"step": self.step, "minutes": round(self.elapsed / 60, 2), "train_loss": train_loss,
                                 "eval_loss": loss, "tau": tau, "tau_decode": tau_decode})
            self.log(f"eval step {self.step}: held-out tau {tau:.3f} (K={k}), decode tau {tau_decode:.3f}, "
                     f"loss {loss:.3f}")

        if eval_seqs and not self.history:
            record(None)
        stop = []  # SIGTERM or Ctrl-C: finish the step, save, return (a background run loses nothing)
        restore = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                restore[sig] = signal.signal(sig, lambda signum, _: stop.append(signum))
        try:
            signum = self._loop(cfg, record, eval_seqs, export, budget, session_end, stop)
        finally:
            for sig, h in restore.items():
                signal.signal(sig, h)
            if self.bar is not None:
                self.bar.close()
        if signum:
            self.log(f"stopped by a signal at step {self.step}; --resume continues")
        if self.dist is not None:  # the checkpoint rank 0 writes stands for every rank only if they agree
            if not self.dist.same_everywhere(self.params):
                raise RuntimeError(f"the drafter's weights differ between the {self.world} ranks at step {self.step}")
            self.log(f"weights identical on all {self.world} ranks at step {self.step}")
        self.save(export)
        if self.rank == 0:
            with open(os.path.join(self.out, "history.json"), "w") as f:
                json.dump(self.history, f, indent=1)
        if self.dist is not None:
            self.dist.barrier()  # the checkpoint is on disk before any rank reports success
        return signum or None

    def _should_stop(self, stop, budget, session_end) -> int:
        """The signal number (or -1 for a budget) at which every rank stops at this same step, else 0."""
        why = stop[0] if stop else 0
        if not why and ((budget is not None and self.elapsed >= budget)
                        or (session_end is not None and time.time() >= session_end)):
            why = -1
        if self.dist is not None:  # one rank seeing a signal or its clock run out stops them all here
            why = int(self.dist.max_value(why))
        return why

    def _loop(self, cfg, record, eval_seqs, export, budget, session_end, stop) -> int:
        t_last, rows_acc, tok_acc = time.time(), 0, 0
        log_every = getattr(cfg, "log_every", 10)
        while self.step < cfg.max_steps:
            why = self._should_stop(stop, budget, session_end)
            if why:
                return max(why, 0)
            t0 = time.time()
            loss, rows, tokens = self.train_step()
            self.elapsed += time.time() - t0
            rows_acc += rows
            tok_acc += tokens
            lr = lr_at(self.step, cfg)
            if self.bar is not None:
                self.bar.update(1)
                self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.1e}",
                                     tok_s=f"{tokens / max(time.time() - t0, 1e-9):.0f}", refresh=False)
            if self.step % log_every == 0:
                dt = max(time.time() - t_last, 1e-9)
                self.log(f"step {self.step} loss {loss:.3f} lr {lr:.2e} {tok_acc / dt:.0f} tokens/s "
                         f"({rows_acc / dt:.0f} label-rows/s)")
                t_last, rows_acc, tok_acc = time.time(), 0, 0
            if eval_seqs and (self.step % cfg.eval_every == 0 or self.step == cfg.max_steps):
                record(loss)
                if self.bar is not None:
                    h = self.history[-1]
                    self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.1e}", tau=f"{h['tau_decode']:.2f}")
            if self.step % cfg.save_every == 0:
                self.save(export)
        return 0
