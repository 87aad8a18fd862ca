import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # tests/ only: `import tiny`
# DFLASH_TEST_THREADS=1 keeps a busy shared machine usable (OpenMP threads spin when cores are oversubscribed)
torch.set_num_threads(int(os.environ.get("DFLASH_TEST_THREADS") or max(1, min(2, os.cpu_count() or 1))))


@pytest.fixture(scope="module")
def invariant_kernels():
    """The batch-invariant kernels built and loaded; the ISA and thread count a module's tests change restored."""
    from dflash_trt.plugins import invariant as bi

    bi.load()
    threads = torch.get_num_threads()
    yield bi
    bi.set_isa("auto")
    bi.set_pairs("auto")
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_pairs(tmp_path_factory):
    """Tiny random targets (Llama GQA, Llama tied + llama3 rope, Qwen3) each with a random drafter."""
    import tiny

    root = tmp_path_factory.mktemp("pairs")
    out = {}
    specs = {
        "llama": dict(kind="llama"),
        "llama_tied_rope": dict(kind="llama", tied=True, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}),
        "qwen3": dict(kind="qwen3", head_dim=32),
    }
    for name, kw in specs.items():
        t = tiny.make_target(str(root / f"{name}_target"), **kw)
        d = tiny.make_drafter(str(root / f"{name}_draft"), t, block_size=8)
        out[name] = (t, d)
    return out
