"""Kimi K2.5 / K2.6 targets (`kimi_k25`: Kimi_K25ForConditionalGeneration, a vision tower around a DeepSeek-V3
language model) served text-only: text_config read, language-model weights under the wrapper's prefix in each
layout they come in, vision weights ignored; logits and captured features vs transformers' own wrapper, DFlash ==
AR (every acceptance length, under load), bad layouts."""
import json
import os
import shutil

import pytest
import torch

import families
import test_families_batching
import test_lossless
from dflash_trt import LLM, SamplingParams
from dflash_trt.config import TargetConfig
from dflash_trt.errors import CheckpointError

# the release's text_config says kimi_k2; transformers' Kimi_K25Config renames it deepseek_v3
TEXT = dict(model_type="kimi_k2", vocab_size=families.VOCAB, hidden_size=64, intermediate_size=96,
            moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
            first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=16, routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=2048,
            initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
VISION = dict(patch_size=2, pos_emb_height=4, pos_emb_width=4, pos_emb_time=1, num_attention_heads=2,
              num_hidden_layers=1, hidden_size=16, intermediate_size=32, merge_kernel_size=[2, 2])


def kimi_k25(path, seed=0, tie=False, **text_over):
    from transformers import Kimi_K25Config, Kimi_K25ForConditionalGeneration

    torch.manual_seed(seed)
    cfg = Kimi_K25Config(text_config={**TEXT, **text_over}, vision_config=VISION, projection_hidden_size=16,
                         tie_word_embeddings=tie, image_token_id=families.VOCAB - 2,
                         video_token_id=families.VOCAB - 1)
    model = Kimi_K25ForConditionalGeneration(cfg)
    with torch.no_grad():  # a non-zero correction bias, so expert choice and expert weights really differ
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.add_(torch.randn_like(b) * 0.1)
    return families.save_hf(model, path)


# the second layout: Kimi K2.6's rope (YaRN, mscale_all_dim), 4 groups of which 2 kept, 3 experts per token, tied
# embeddings (the wrapper's tie_word_embeddings, which transformers follows, not text_config's). Not a plain q_proj
# (q_lora_rank null, which no Kimi release has): transformers 5.24's save_pretrained writes self_attn.q_proj as
# `self_wqkv` (its vision tower's wqkv -> attn.q_proj rename, reversed, matches) and cannot load it back either.
SECOND = dict(num_hidden_layers=3, q_lora_rank=16, n_group=4, topk_group=2, num_experts_per_tok=3,
              n_shared_experts=2, norm_topk_prob=False, routed_scaling_factor=1.5, max_position_embeddings=256,
              rope_parameters=dict(rope_type="yarn", rope_theta=50000.0, factor=4.0, original_max_position_embeddings=64,
                                   mscale=1.0, mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("kimi_k25")
    t = kimi_k25(str(root / "t"))
    t2 = kimi_k25(str(root / "t2"), seed=1, tie=True, **SECOND)
    return {"t": t, "d": families.drafter_for(str(root / "d"), t), "t2": t2,
            "d2": families.drafter_for(str(root / "d2"), t2, block_size=16)}


def test_config_is_the_text_config(models):
    c = TargetConfig.from_dir(models["t"])
    assert c.model_type == "kimi_k25" and c.mla.q_lora_rank == 24 and c.num_hidden_layers == 3
    assert (c.moe.num_experts, c.moe.dense_layers, c.moe.router) == (8, [0], "sigmoid_group")
    assert not c.tie_word_embeddings and c.vocab_size == families.VOCAB and c.eos_token_ids == [2]
    c2 = TargetConfig.from_dir(models["t2"])
    assert c2.tie_word_embeddings and c2.rope.rope_type == "yarn" and c2.mla.q_lora_rank == 16


def test_checkpoint_is_the_wrapper(models):
    """What the tests run on is the wrapper as transformers saves it: vision weights and all."""
    from safetensors import safe_open

    with safe_open(os.path.join(models["t"], "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert any(n.startswith("vision_tower.") for n in names) and any(n.startswith("mm_projector.") for n in names)
    assert "language_model.model.embed_tokens.weight" in names and "language_model.lm_head.weight" in names


@pytest.mark.parametrize("invariant", [True, False], ids=["cpu_kernels", "pytorch"])
@pytest.mark.parametrize("name", ["t", "t2"])
def test_logits_match_transformers(models, name, invariant):
    # fp32 both sides, against transformers' Kimi_K25ForConditionalGeneration on text: the DeepSeek-V3 bound (our
    # absorbed kv_b_proj sums in another order than transformers' decompressed keys and values, ~3e-6)
    assert families.max_rel_logit_error(models[name], invariant=invariant) < 1e-4


def test_media_placeholders_embed_as_token_zero(models):
    """Kimi_K25Model zeroes the image / video placeholder ids before embedding them, media or not (the parity test's
    random rows include both ids, VOCAB - 2 and VOCAB - 1): text-only serving does the same."""
    from dflash_trt.loader import ModelPaths, load_models
    from dflash_trt.teacher import teacher_forward

    m, _ = load_models(ModelPaths(models["t"], None), TargetConfig.from_dir(models["t"]), None, torch.float32, "cpu")
    v = families.VOCAB
    a, b, c = (teacher_forward(m, [s])[1] for s in ([5, v - 2, 7, v - 1], [5, 0, 7, 0], [5, 9, 7, 9]))
    assert torch.equal(a, b) and not torch.allclose(a, c)


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
    """test_families_batching's workload: staggered arrivals, chunked prefill, preemption over the compressed latent
    cache; tokens and drafts equal each request's alone."""
    test_families_batching.test_lossless_under_load_with_chunking_and_preemption(
        lambda _: (models["t2"], models["d2"], 0), "kimi_k25")


def _rename(src, dst, rename):
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    w = load_file(os.path.join(dst, "model.safetensors"))
    save_file({rename(k): v for k, v in w.items() if rename(k)}, os.path.join(dst, "model.safetensors"))
    return str(dst)


def _release(k):  # Moonshot's release: language_model.model.layers.N (transformers 5.24 saves them as blocks.N)
    return k.replace("language_model.model.blocks.", "language_model.model.layers.")


def _in_memory(k):  # transformers' own module names
    k = k.replace("language_model.model.blocks.", "model.language_model.layers.")
    return k.replace("language_model.model.", "model.language_model.").replace("language_model.lm_head.", "lm_head.")


@pytest.mark.parametrize("rename", [_release, _in_memory, lambda k: None if "vision" in k or "mm_proj" in k else k],
                         ids=["release", "in_memory", "no_vision"])
def test_every_weight_layout_gives_the_same_tokens(models, tmp_path, rename):
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    ps = families.prompts(2, seed=4)
    d = _rename(models["t"], tmp_path / "renamed", rename)
    outs = [[o.token_ids for o in LLM(target=x, speculative=False).generate(ps, sp)] for x in (d, models["t"])]
    assert outs[0] == outs[1]


def test_missing_language_weight_fails_clearly(models, tmp_path):
    d = _rename(models["t"], tmp_path / "missing",
                lambda k: None if k == "language_model.model.blocks.1.mlp.experts.5.up_proj.weight" else k)
    with pytest.raises(CheckpointError, match="target checkpoint lacks 1 weights, e.g. model.layers.1.mlp.experts.5") as e:
        LLM(target=d, speculative=False)
    assert "\n" not in str(e.value)


def copy_with(src, dst, **change):
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    for k, v in change.items():
        if k == "text_config":
            cfg[k].update(v)
        else:
            cfg[k] = v
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return str(dst)


@pytest.mark.parametrize("change,msg", [
    (dict(quantization_config={"quant_method": "compressed-tensors", "format": "pack-quantized"}),
     "unsupported kimi_k25 quantization 'compressed-tensors'"),
    (dict(text_config={"quantization_config": {"quant_method": "compressed-tensors"}}),
     "unsupported deepseek_v3 quantization 'compressed-tensors'"),
    (dict(text_config={"n_group": 3}), "unsupported deepseek_v3 MoE layout"),
    (dict(text_config={"model_type": "qwen3"}), "unsupported kimi_k25 text_config model_type 'qwen3'"),
])
def test_bad_layouts_fail_clearly(models, tmp_path, change, msg):
    d = copy_with(models["t"], tmp_path / "bad", **change)
    with pytest.raises(CheckpointError, match=msg) as e:
        TargetConfig.from_dir(d)
    assert "\n" not in str(e.value)


def test_tensor_parallel_is_refused(models):
    families.assert_tp_refused(models["t"], "kimi_k25")
