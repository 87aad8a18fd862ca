"""MiniMax-M2 targets: sigmoid router with a correction bias (every layer sparse), q/k norms over the whole
projection, partial RoPE; logits and captured features vs transformers, DFlash == AR (every acceptance length,
under load), both checkpoint layouts, bad layouts."""
import json
import os
import shutil

import pytest
import torch

import families
import test_families_batching
import test_lossless
from dflash_trt import LLM
from dflash_trt.config import TargetConfig
from dflash_trt.errors import CheckpointError


def minimax_m2(path, seed=0, **over):
    from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM

    torch.manual_seed(seed)
    # rotary_dim: the release's legacy spelling of partial RoPE (8 of 16 dims rotate)
    kw = dict(vocab_size=families.VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
              rotary_dim=8, max_position_embeddings=2048, initializer_range=0.2, bos_token_id=1, eos_token_id=2,
              pad_token_id=0, tie_word_embeddings=False)
    kw.update(over)
    model = MiniMaxM2ForCausalLM(MiniMaxM2Config(**kw))
    with torch.no_grad():  # a non-zero correction bias, so expert choice and expert weights really differ
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.add_(torch.randn_like(b) * 0.1)
    return families.save_hf(model, path)


# the second layout: 3 of 6 experts, MQA-like GQA (1 kv head), a quarter of each head rotating (partial_rotary_factor
# in rope_parameters, transformers' own spelling), another rope base
SECOND = dict(num_hidden_layers=3, num_local_experts=6, num_experts_per_tok=3, num_key_value_heads=1, rotary_dim=None,
              rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("minimax_m2")
    t = minimax_m2(str(root / "t"))
    t2 = minimax_m2(str(root / "t2"), seed=1, **SECOND)
    return {"t": t, "d": families.drafter_for(str(root / "d"), t), "t2": t2,
            "d2": families.drafter_for(str(root / "d2"), t2, block_size=16)}


def test_config_layout(models):
    c = TargetConfig.from_dir(models["t"])
    assert (c.moe.num_experts, c.moe.top_k, c.moe.router, c.moe.dense_layers) == (8, 2, "sigmoid_bias", [])
    assert c.moe.intermediate_size == 32 and c.rotary_dim == 8 and c.head_dim == 16 and not c.qk_norm
    c2 = TargetConfig.from_dir(models["t2"])
    assert (c2.moe.num_experts, c2.moe.top_k, c2.rotary_dim, c2.num_key_value_heads) == (6, 3, 4, 1)


@pytest.mark.parametrize("invariant", [True, False], ids=["cpu_kernels", "pytorch"])
@pytest.mark.parametrize("name", ["t", "t2"])
def test_logits_match_transformers(models, name, invariant):
    # fp32 both sides; the differences are summation orders (experts as separate gate/up/down matmuls against
    # transformers' fused gate_up_proj, our kernels' trees), ~1e-6 relative. A router near-tie could flip an
    # expert choice and exceed it; these seeds have none. The bound is the other families' 1e-4.
    assert families.max_rel_logit_error(models[name], invariant=invariant) < 1e-4


@pytest.mark.parametrize("name", ["t", "t2"])
def test_captured_features_are_transformers_hidden_states(models, name):
    assert families.max_rel_capture_error(models[name]) < 1e-4


def test_dflash_equals_ar(models):
    ps = families.prompts(10, seed=3)
    assert families.assert_lossless(models["t"], models["d"], ps) > 0


@pytest.mark.parametrize("k", [7])
def test_every_acceptance_length(models, k):
    """test_lossless's oracle drafter (the target's own continuation cut at a moving position) on this family."""
    test_lossless.test_every_acceptance_length_is_exercised({"llama": (models["t"], models["d"])}, k)


def test_lossless_under_load_with_chunking_and_preemption(models):
    """test_families_batching's workload: staggered arrivals, chunked prefill, preemption; tokens and drafts
    equal each request's alone."""
    test_families_batching.test_lossless_under_load_with_chunking_and_preemption(
        lambda _: (models["t2"], models["d2"], 0), "minimax_m2")


def test_fused_in_memory_layout_loads_the_same(models, tmp_path):
    """transformers 5 in memory: `mlp.gate`, `mlp.e_score_correction_bias`, fused experts.gate_up_proj [E, 2I, H]
    / down_proj [E, H, I]. A checkpoint saved that way gives the release layout's logits exactly."""
    from safetensors.torch import save_file

    from dflash_trt.loader import ModelPaths, load_models
    from dflash_trt.teacher import teacher_forward

    fused = tmp_path / "fused"
    shutil.copytree(models["t"], fused)
    os.remove(fused / "model.safetensors")
    state = families.hf_model(models["t"]).state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in state and "model.layers.0.mlp.e_score_correction_bias" in state
    save_file({k: v.contiguous() for k, v in state.items()}, str(fused / "model.safetensors"))
    p = families.prompts(2, seed=9, lo=20, hi=30)
    outs = []
    for d in (models["t"], str(fused)):
        m, _ = load_models(ModelPaths(d, None), TargetConfig.from_dir(d), None, torch.float32, "cpu")
        outs.append(teacher_forward(m, p)[1])
    assert torch.equal(outs[0], outs[1])


def copy_with(src, dst, **change):
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(change)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return str(dst)


@pytest.mark.parametrize("change,msg", [
    (dict(num_experts_per_tok=9), "unsupported minimax_m2 MoE layout"),
    (dict(hidden_act="gelu"), "only silu"),
    (dict(rotary_dim=3, rope_parameters=None), "unsupported minimax_m2 partial rotary"),
    (dict(quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}),
     "unsupported minimax_m2 quantization 'fp8'"),
])
def test_bad_layouts_fail_clearly(models, tmp_path, change, msg):
    d = copy_with(models["t"], tmp_path / "bad", **change)
    with pytest.raises(CheckpointError, match=msg) as e:
        TargetConfig.from_dir(d)
    assert "\n" not in str(e.value)


def test_missing_router_bias_fails_clearly(models, tmp_path):
    from safetensors.torch import load_file, save_file

    d = tmp_path / "missing"
    shutil.copytree(models["t"], d)
    w = load_file(str(d / "model.safetensors"))
    del w["model.layers.2.block_sparse_moe.e_score_correction_bias"]
    save_file(w, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="e_score_correction_bias") as e:
        LLM(target=str(d), speculative=False)
    assert "\n" not in str(e.value)


def test_tensor_parallel_is_refused(models):
    families.assert_tp_refused(models["t"], "minimax_m2")
