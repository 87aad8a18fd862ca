"""The fused decoder layer (plugins/layer.py) and fused q/k/v, gate/up projections are bitwise the op-by-op path.

One packed batch holds a prefill chunk (with earlier keys already cached), a verify block and two decode rows,
so every kind of row a step mixes goes through the same call; outputs, captured features and the K/V caches
must be identical, for float32 and bfloat16 activations, with and without q/k norms and attention biases.
"""
import copy
import json
import os

import pytest
import torch

import tiny
from dflash_trt import LLM, SamplingParams, ops
from dflash_trt.attention import AttentionBatch
from dflash_trt.config import TargetConfig
from dflash_trt.loader import ModelPaths, load_models
from dflash_trt.models.target import pack_linears


def biased_llama(path: str) -> str:
    """Attention and MLP biases, and sizes that are not multiples of the kernels' 32-column panels (k/v 24
    columns, intermediate 72), so the fused outputs carry padding columns the views must skip."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=tiny.VOCAB, hidden_size=64, intermediate_size=72, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=24, attention_bias=True,
                      mlp_bias=True, max_position_embeddings=2048, initializer_range=0.2, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or "bias" in n:
                p.add_(torch.randn_like(p) * 0.3)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(path)
    tiny.add_tokenizer(path)
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["attention_bias"] is True
    return path


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    assert ops.enable_invariant(), "the batch-invariant kernels must build here"
    root = tmp_path_factory.mktemp("fused")
    return {"qwen3": tiny.make_target(str(root / "qwen3"), kind="qwen3", head_dim=32),
            "llama_bias": biased_llama(str(root / "llama_bias"))}


def load(tdir, dtype, fuse: bool):
    target, _ = load_models(ModelPaths(tdir, None), TargetConfig.from_dir(tdir), None, dtype, "cpu")
    if fuse:
        target.pack()
    else:  # what pack did before projections were fused
        pack_linears(target)
        target.head_packed = ops.pack(target.head_weight.data)
    # the last layer's features are its normed output (TargetModel.finish); order and duplicates as configured
    target.capture_ids = [1, 0, len(target.model.layers) - 1, 1]
    return target


def mixed_batch(cfg, dtype, page=4):
    """(q_len, kv_len, block table): a prefill chunk after 3 cached positions, a verify block of 8 at 12
    cached positions, and two decode rows."""
    rows = [(7, 10, [0, 1, 2]), (8, 20, [3, 4, 5, 6, 7]), (1, 5, [8, 9]), (1, 13, [10, 11, 12, 13])]
    g = torch.Generator().manual_seed(0)
    shape = (16, page, cfg.num_key_value_heads, cfg.head_dim)
    caches = [(torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype))
              for _ in range(cfg.num_hidden_layers)]
    ids = torch.randint(3, cfg.vocab_size, (sum(q for q, _, _ in rows),), generator=g)
    pos = torch.cat([torch.arange(kv - q, kv) for q, kv, _ in rows])
    return ids, pos, caches, AttentionBatch.build(rows, page, "cpu")


def forward(target, ids, pos, caches, batch, work=None):
    """work: a list of cache tensors to run in (the contents of `caches` copied in), the same list object on every
    call as an engine's, so what a model keeps per cache list (its one-op stack state) is reused."""
    if work is None:
        caches = copy.deepcopy(caches)
    else:
        for (k, v), (wk, wv) in zip(caches, work):
            wk.copy_(k)
            wv.copy_(v)
        caches = work
    with torch.no_grad():
        h, feats = target(ids, pos, caches, batch, capture=True)
    return h, feats, caches


def assert_same(a, b, what):
    (ha, fa, ca), (hb, fb, cb) = a, b
    assert torch.equal(ha, hb), f"{what}: final hidden states differ by {(ha - hb).abs().max().item():.3g}"
    assert torch.equal(fa, fb), f"{what}: captured features differ"
    for i, (x, y) in enumerate(zip(ca, cb)):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]), f"{what}: layer {i} K/V cache differs"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ["qwen3", "llama_bias"])
def test_fused_layer_and_projections_are_bitwise_the_op_by_op_path(targets, name, dtype, monkeypatch):
    plain, fused = load(targets[name], dtype, False), load(targets[name], dtype, True)
    ids, pos, caches, batch = mixed_batch(plain.cfg, dtype)
    ref = forward(plain, ids, pos, caches, batch)

    layers = fused.model.layers
    assert all(l.fusable for l in layers)
    assert_same(forward(fused, ids, pos, caches, batch), ref, "fused layer stack")
    assert all(l._fused is not None for l in layers), "the C++ layer op did not run"
    assert fused._stack[1] is not None, "the layers did not run as one stack op"

    fused._fused_stack = lambda *a: None  # one op per layer
    assert_same(forward(fused, ids, pos, caches, batch), ref, "fused layer op")
    del fused._fused_stack

    from dflash_trt.plugins import layer as fused_op

    stacks, run_stack = [], fused_op.run_stack

    def counted(*a):
        stacks.append(1)
        return run_stack(*a)

    monkeypatch.setattr(fused_op, "run_stack", counted)
    work = copy.deepcopy(caches)  # one cache list from here on, as an engine's: the model keeps its stack for it
    assert_same(forward(fused, ids, pos, caches, batch, work), ref, "fused layer stack, kept")
    for l in layers:  # the fused projections alone, through the Python modules
        l.fusable = False
    assert_same(forward(fused, ids, pos, caches, batch, work), ref, "fused projections")
    assert stacks == [1], "a layer marked not fusable still ran in the kept stack op"


def test_replaced_member_weights_are_noticed(targets):
    """A member re-packed after fusion (the loader's FP8 re-packing does this) must not leave the layer on the
    stale fused weights: the fusion is rebuilt from the members' current panels."""
    from dflash_trt.plugins import invariant

    plain, fused = load(targets["qwen3"], torch.float32, False), load(targets["qwen3"], torch.float32, True)
    ids, pos, caches, batch = mixed_batch(plain.cfg, torch.float32)
    work = copy.deepcopy(caches)  # one cache list throughout, as an engine's
    forward(fused, ids, pos, caches, batch, work)  # the layers' one-op states are built and cached first
    assert all(l._fused is not None for l in fused.model.layers)
    for model in (plain, fused):
        with torch.no_grad():
            for l in model.model.layers:
                for m in (l.self_attn.k_proj, l.mlp.up_proj):
                    m.weight.mul_(0.5)
                    m.packed = invariant.pack_linear(m.weight.data)
    ids, pos, caches, batch = mixed_batch(plain.cfg, torch.float32)
    got = forward(fused, ids, pos, caches, batch, work)
    assert_same(got, forward(plain, ids, pos, caches, batch), "re-packed")


def test_rope_with_fma_would_be_caught(targets):
    """The test above fails on a rope that rounds differently: contracting x*cos + rot*sin into one FMA (what
    the C++ rope must not do) changes bits, and the comparison sees it."""
    from dflash_trt import rope

    plain = load(targets["qwen3"], torch.float32, False)
    ids, pos, caches, batch = mixed_batch(plain.cfg, torch.float32)
    ref = forward(plain, ids, pos, caches, batch)
    exact = rope.apply_rope

    def fma_rope(x, cos, sin):  # x*cos + rot*sin with the second product unrounded (fp64 then one rounding)
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return ((x * cos[:, None, :]).double() + rot.double() * sin[:, None, :].double()).to(x.dtype)

    import dflash_trt.models.target as target_mod
    target_mod.apply_rope = fma_rope
    try:
        broken = forward(plain, ids, pos, caches, batch)
    finally:
        target_mod.apply_rope = exact
    with pytest.raises(AssertionError):
        assert_same(broken, ref, "fma rope")


def test_engine_dflash_still_equals_ar_with_the_fused_layer(tmp_path):
    t = tiny.make_target(str(tmp_path / "t"), kind="qwen3", head_dim=32, boost_tokens=(11,), boost=5.0)
    d = tiny.make_drafter(str(tmp_path / "d"), t, block_size=8, mask_token_id=tiny.mask_proposing(t, 11),
                          residual_scale=0.3)
    g = torch.Generator().manual_seed(5)
    ps = [torch.randint(3, tiny.VOCAB, (int(n),), generator=g).tolist() for n in (5, 17, 31, 2)]
    sp = SamplingParams(max_tokens=20, ignore_eos=True)
    for dtype in ("float32", "bfloat16"):
        ar_llm = LLM(target=t, speculative=False, dtype=dtype)
        ar = [o.token_ids for o in ar_llm.generate(ps, sp)]
        spec = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=7, dtype=dtype, max_batch_size=4)
        outs = spec.generate(ps, sp)
        assert [o.token_ids for o in outs] == ar, dtype
        assert sum(o.accepted for o in outs) > 0
        for llm in (ar_llm, spec):
            assert all(l._fused is not None for l in llm.engine.target.model.layers), "fused layer not used"
