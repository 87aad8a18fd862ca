"""benchmarks/membw.py's floor counts and benchmarks/peers.py's peer selection, on real tiny checkpoints and
real GGUF files."""
import importlib.util
import os
import sys

import numpy as np
import pytest
from safetensors.torch import load_file

import tiny

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


def _script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, mod)  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


membw = _script("membw")


def _expected(path, width, scales):
    """Bytes a pass reads, counted from the checkpoint file: its matrices at `width` bytes per weight (plus a
    4-byte scale per output row when `scales`), its norms at fp32. The tied embedding counts once, as the head."""
    total = 0
    for name, t in load_file(os.path.join(path, "model.safetensors")).items():
        if t.dim() == 2:
            total += t.numel() * width + (t.shape[0] * 4 if scales else 0)
        else:
            total += t.numel() * 4
    return total


@pytest.mark.parametrize("weights,width,scales", [("auto", 4, False), ("bf16", 2, False), ("int8", 1, True)])
def test_step_bytes_are_what_the_kernels_read(tmp_path, weights, width, scales):
    from dflash_trt import LLM

    t = tiny.make_target(str(tmp_path / "t"), layers=2, tied=True)
    d = tiny.make_drafter(str(tmp_path / "d"), t)
    e = LLM(target=t, draft=d, max_batch_size=1, max_seq_len=64, weights=weights, draft_weights=weights).engine
    head = 128 * 64 * width + (128 * 4 if scales else 0)
    assert membw.target_step_bytes(e.target) == _expected(t, width, scales)
    # the drafter's own layers packed as the target's, and it drafts with the target's head
    drafter_own = _expected(d, width, scales)
    assert membw.drafter_step_bytes(e.proposer.drafter, e.target) == drafter_own + head
    macs = sum(x.numel() for x in load_file(os.path.join(t, "model.safetensors")).values() if x.dim() == 2)
    assert membw.target_block_flops(e.target, 8) == 2.0 * 8 * macs


def test_floor_is_the_longer_of_bytes_and_flops_over_tau():
    # a memory-bound pass (0.1 s) and a compute-bound one (0.2 s) in one step committing 2 tokens
    passes = [(1e9, 1e8), (1e8, 2e9)]
    assert membw.per_token_floor_s(passes, bandwidth=1e10, peak=1e10, tokens_per_step=2.0) == pytest.approx(0.15)
    assert membw.floor_s(1e9, 1e10) == pytest.approx(0.1)


def test_each_pass_is_floored_at_the_peak_of_its_dot_products(tmp_path):
    # the same pass at bf16 or int8 dot products runs at their peak, not fp32's; a pass without a kind is fp32
    passes = [(1e8, 4e9, "bf16"), (1e8, 4e9, "int8"), (1e8, 4e9)]
    peak = {"fp32": 1e10, "bf16": 2e10, "int8": 4e10}
    assert membw.per_token_floor_s(passes, bandwidth=1e10, peak=peak) == pytest.approx(0.2 + 0.1 + 0.4)
    # which dot products an engine's packed weights run: bf16 models' k-pairs, W8A8's int8, fp32 otherwise
    from dflash_trt import LLM

    t = tiny.make_target(str(tmp_path / "t"), layers=2, tied=True)
    kinds = {}
    for dtype, weights in (("float32", "auto"), ("bfloat16", "auto"), ("bfloat16", "w8a8"), ("float32", "int8")):
        target = LLM(target=t, speculative=False, max_batch_size=1, max_seq_len=64, dtype=dtype,
                     weights=weights).engine.target
        kinds[dtype, weights] = membw.dot_kind(target, target.head_packed)
    from dflash_trt.plugins import invariant

    bf16 = "bf16" if invariant.bf16_pairs_pay() else "fp32"
    assert kinds == {("float32", "auto"): "fp32", ("bfloat16", "auto"): bf16, ("bfloat16", "w8a8"): "int8",
                     ("float32", "int8"): "fp32"}
    peers = _script("peers")
    assert [peers.gguf_kind(f"/x/m.{k}.gguf") for k in ("F32", "BF16", "Q8_0")] == ["fp32", "bf16", "int8"]


def _gguf(path, tied):
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.zeros((128, 64), np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), np.float16))
    w.add_tensor("output_norm.weight", np.zeros(64, np.float32))
    if not tied:
        w.add_tensor("output.weight", np.zeros((128, 64), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_gguf_counts_read_the_head_once(tmp_path):
    tied = membw.gguf_counts(_gguf(tmp_path / "tied.gguf", True))
    assert tied == {"bytes": 128 * 64 * 4 + 64 * 64 * 2 + 64 * 4, "macs": 128 * 64 + 64 * 64,
                    "head_bytes": 128 * 64 * 4, "head_macs": 128 * 64}
    # an output matrix of its own: the embedding is only looked up by row
    untied = membw.gguf_counts(_gguf(tmp_path / "untied.gguf", False))
    assert untied == {"bytes": 128 * 64 * 2 + 64 * 64 * 2 + 64 * 4, "macs": 128 * 64 + 64 * 64,
                      "head_bytes": 128 * 64 * 2, "head_macs": 128 * 64}


def test_only_expands_llamacpp_and_names_a_bad_peer():
    peers = _script("peers")
    assert peers._only("ours,llamacpp-bf16") == {"ours", "llamacpp-bf16"}
    assert peers._only("llamacpp") >= {f"llamacpp-{k}" for k in ("f32", "bf16", "q8_0", "q4_1", "dflash")}
    with pytest.raises(SystemExit, match="unknown peer 'llama' in --only"):
        peers._only("ours,llama")
