"""Greedy tokens from the head without reading all of it at full width: a screen that is exact.

A decode step of a small model streams its weights once, and the head is a large share of them (SmolLM2-135M:
49,152 x 576, 21% of the bytes; Qwen3-0.6B: 26%). A greedy step only needs each row's argmax, so the head is
read twice over instead: first as int8 codes (half the bytes of bf16, integer dot products), giving every
logit to within a bound, then at full precision only for the tokens that could still be the maximum.

The bound is rigorous, so the tokens are exactly those of the full head, rounding, ties (the first index wins)
and all. For a row x (the values the head kernel multiplies) and a vocabulary row w (with w_O its columns in a
few outlier dimensions O, kept out of the codes and multiplied in fp32, and w_R the rest):

    x.w = sum_c sx_c sw (p_c . q_c)  +  sum_c sw (e_c . q_c)  +  x_R . r  +  x_O . w_O

with p_c, sx_c the W8A8 kernel's codes and scale of x's chunk c (e_c what they miss), q, sw the int8 codes and
scale of w_R (r what they miss). Cauchy-Schwarz bounds each missing term by norms computed once per vocabulary
row and once per x row; the floating-point errors of the screen and of the full head (sequential fp32 sums of
at most K + 4 terms) are bounded the same way. A token is a candidate when its upper bound reaches the largest
lower bound, less the gap the output's rounding can close (bf16 logits: 2^-5 of it). The candidates' exact
logits come from the head's own kernel on panels of just their columns, packed from the head's rows as its
panels hold them (a column's result depends on nothing else), and the argmax over them, in vocabulary order,
is the full head's.

Outlier dimensions: a few hidden dimensions carry values far above the rest (SmolLM2's dimension 199), and a
per-row int8 scale set by them would blur every other dimension. The screen arms after its first rows, keeping
out the dimensions of the largest mean |x| it saw; which ones are kept never changes a token, only how many
candidates there are. Where too many remain (or x is not finite), the caller computes full logits. The codes
and norms are made when the engine loads (`TargetModel.prepare_greedy_head`); arming only copies out the
outlier columns.
"""
from __future__ import annotations

import torch

from .plugins import invariant as bi

CHUNKS = 8  # K chunks of the screen's per-row x scales (finer chunks: smaller scales where x is flat)
OUTLIERS = 16  # dimensions multiplied in fp32 beside the codes
ARM_ROWS = 64  # rows seen (through the full head) before the outlier dimensions are chosen
MAX_CANDIDATES = 1024  # per call; above it the full head is cheaper
# rows per call up to which a bf16 k-pair head is screened: past them the W8A8 pass and the bounds cost what its full
# head does (bf16 products, at twice the fp32 multiply-adds). Heads multiplied with fp32 FMAs (fp32 and widened bf16
# panels) are screened at any number of rows: their full head is compute-bound from a few rows on, at a fraction of
# the W8A8 pass's rate (docs/cpu_performance.md)
SCREEN_ROWS = 8


class GreedyHead:
    """The exact greedy screen of one packed head (see the module doc). `tokens(x)` returns each row's argmax
    token, or None when the caller must compute logits (not armed yet, too many candidates, x not finite)."""

    @staticmethod
    def screens(packed) -> bool:
        """Whether a head packed so is screened: bf16 k-pair, widened bf16 or fp32 panels (8-bit ones are read at
        the screen's width already)."""
        return packed.data.dtype in (torch.int16, torch.bfloat16, torch.float32)

    def __init__(self, weight: torch.Tensor, packed):
        kind = packed.data.dtype
        self.packed = packed
        self.pairs = kind == torch.int16  # bf16 k-pair panels: the kernel rounds x to bf16
        self.max_rows = SCREEN_ROWS if self.pairs else None  # None: any
        # the engine's head, row-major, not copied: the candidates' exact logits are packed from its rows (bf16
        # panels hold its values rounded to bf16, as the kernel's packing rounds them)
        self.values = torch.bfloat16 if kind != torch.float32 else torch.float32  # what the panels hold
        w = weight.detach()
        self.rows = (w if w.dtype in (torch.float32, torch.bfloat16) else w.to(self.values)).contiguous()
        self.V, self.K = self.rows.shape
        self.chunks = CHUNKS if self.K % (4 * CHUNKS) == 0 else 1
        # the codes of whole rows: x's outlier dimensions are zeroed before the screen, so their codes multiply
        # nothing, and the norms over whole rows bound those over the rest
        wf = self.rows.to(self.values).float()  # the panels' values, exactly
        q, sw = bi.quantize_int8(wf)
        self.screen = bi.pack_linear_w8a8(q, sw)
        # per vocabulary row: sw |q|, |r| (what the codes miss), |w|, as fp32 sums of K squares (relative error
        # under K u: 2^-12 above them is an upper bound up to K = 4,096); r's own roundings add 4u sw |q|
        swq = q.float() * sw.view(-1, 1)
        nq = swq.norm(dim=1)
        up = 1 + max(2.0 ** -12, self.K * 2.0 ** -22)
        self.g = torch.stack([nq * up, ((wf - swq).norm(dim=1) + nq * 2.0 ** -22) * up,
                              wf.norm(dim=1) * up]).contiguous()  # [3, V]
        self.g_max = self.g.amax(1).contiguous()
        self.seen = torch.zeros(self.K, dtype=torch.float64)
        self.rows_seen = 0
        self.armed = False

    def takes(self, rows: int) -> bool:
        """Whether a call of `rows` rows is screened (else the full head pays)."""
        return self.max_rows is None or rows <= self.max_rows

    def observe(self, x: torch.Tensor) -> None:
        """Rows that went through the full head: their |x| choose the outlier dimensions, then the screen arms."""
        if self.armed:
            return
        xf = self._x(x)
        if not torch.isfinite(xf).all():
            return
        self.seen += xf.abs().double().sum(0)
        self.rows_seen += xf.shape[0]
        if self.rows_seen >= ARM_ROWS:
            self.out_idx = self.seen.topk(min(OUTLIERS, self.K)).indices.sort().values
            # [outliers, V]: the op's column blocks, in the panels' values (bf16 ones read at half the bytes)
            self.wo = self.rows[:, self.out_idx].to(self.values).t().contiguous()
            self.armed = True

    def _x(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).float() if self.pairs else x.float()

    def tokens(self, x: torch.Tensor) -> torch.Tensor | None:
        if not self.armed:
            return None
        # bf16 logits: a candidate's upper bound may fall short of the row's best lower bound by what rounding to
        # bf16 can close (2^-5 of it is two of bf16's steps even across a power of two)
        gap = 2.0 ** -5 if x.dtype == torch.bfloat16 else 0.0
        ids = bi.greedy_head(x, self.pairs, self.out_idx, self.screen, self.chunks, self.wo, self.g, self.g_max, gap,
                             self.packed, self.rows, MAX_CANDIDATES)
        return ids if ids.numel() else None
