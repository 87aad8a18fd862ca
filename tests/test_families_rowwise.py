"""family.rowwise: elementwise PyTorch ops (sigmoid, tanh, gelu) whose CPU loops run a vectorised body and a
scalar tail give every row the same bits whatever the batch around it, so autoregressive steps (one row) and
verify blocks (many rows) agree bit for bit (gpt-oss' SwiGLU sigmoid, Gemma's gelu and soft-cap tanh, DeepSeek's
sigmoid router)."""
import pytest
import torch

from dflash_trt.models.family import rowwise
from dflash_trt.models.gemma3 import gelu_tanh


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", [torch.sigmoid, torch.tanh, gelu_tanh], ids=["sigmoid", "tanh", "gelu_tanh"])
def test_a_rows_bits_do_not_depend_on_the_batch(fn, dtype):
    g = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # rows beyond one thread's grain are chunked: thread boundaries never split a row
    try:
        # widths: DeepSeek's 8-expert router, odd sizes, and 48 (one AVX-512 float vector pair plus a tail)
        for n in (8, 37, 48, 100):
            x = (torch.randn(1200, n, generator=g) * 3).to(dtype)
            full = rowwise(fn, x)
            alone = torch.cat([rowwise(fn, x[i:i + 1]) for i in range(x.shape[0])])
            assert differing_rows(full, alone) == 0, f"width {n}: rows computed alone differ"
            for at, rows in ((1, 2), (5, 7), (100, 3), (3, 700)):
                assert differing_rows(rowwise(fn, x[at:at + rows]), full[at:at + rows]) == 0, (n, at, rows)
    finally:
        torch.set_num_threads(threads)


def differing_rows(a, b):
    """Rows whose bits differ (-0.0 vs 0.0 included)."""
    bits = torch.int16 if a.element_size() == 2 else torch.int32
    return int((a.view(bits) != b.view(bits)).any(-1).sum())
