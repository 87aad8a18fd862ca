"""The W8A16 contract of the 8-bit CPU panels (int8 codes, e4m3 bytes), computed op by op from the fp32 kernel:
each k chunk's FMA chain runs over the codes' exact values, its partial is scaled once by the column's scale,
then the chunks meet in linear's tree and the bias is added."""
import torch

from dflash_trt.plugins import invariant as bi


def reference(x: torch.Tensor, values: torch.Tensor, col_scale: torch.Tensor, bias=None, k_splits: int = 1,
              chunks: range | None = None) -> torch.Tensor:
    """bi.linear(x, packed, bias, k_splits) of 8-bit panels whose code values are `values` [N, K] (fp32, exact)
    with one scale per output column; `chunks`: linear_partial's chunk range instead (no bias)."""
    p = bi.pack_linear(values)
    cs = chunks if chunks is not None else range(k_splits)
    parts = [bi.linear_partial(x, p, c, c + 1, k_splits) * col_scale for c in cs]
    return bi.tree_sum(parts, bias, x.dtype if chunks is None else None)


def assert_close(y: torch.Tensor, y_deq: torch.Tensor, x: torch.Tensor, deq: torch.Tensor) -> None:
    """y within fp32 rounding of y_deq (the fp32 kernel on the dequantised weight deq): per element, 1e-5 of
    sum_k |x w|, the scale a reordered fp32 sum's error is bounded by."""
    bound = 1e-5 * (x.float().abs() @ deq.abs().T) + 1e-30
    assert bool(((y.float() - y_deq.float()).abs() <= bound).all()), float(((y - y_deq).abs() / bound).max())
