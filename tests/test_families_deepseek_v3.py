"""DeepSeek-V3 architecture targets (DeepSeek-V3 / R1, Kimi K2): MLA over the compressed latent cache, shared +
group-limited sigmoid-routed experts, first_k_dense_replace dense layers; logits vs transformers, DFlash == AR,
engines, bad layouts."""
import json
import os
import re
import shutil

import pytest
import torch

import families
from dflash_trt import LLM
from dflash_trt.config import TargetConfig
from dflash_trt.errors import CheckpointError


def deepseek_v3(path, seed=0, **over):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    kw = dict(vocab_size=families.VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
              num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
              num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1,
              kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
              routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=2048, initializer_range=0.2,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    kw.update(over)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**kw))
    with torch.no_grad():  # a non-zero correction bias, so expert choice and expert weights really differ
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.add_(torch.randn_like(b) * 0.1)
    return families.save_hf(model, path)


# the second layout: plain q_proj, 4 groups of which 2 are kept, 3 experts per token, 2 shared experts, no
# renormalisation, rotate-half rope with YaRN (mscale_all_dim scales the softmax), v_head_dim != qk_nope_head_dim
SECOND = dict(num_hidden_layers=3, q_lora_rank=None, n_group=4, topk_group=2, num_experts_per_tok=3,
              n_shared_experts=2, norm_topk_prob=False, routed_scaling_factor=1.5, v_head_dim=24,
              rope_interleave=False, max_position_embeddings=256,
              rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64,
                                   mscale=1.0, mscale_all_dim=0.8, beta_fast=32.0, beta_slow=1.0))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepseek_v3")
    t = deepseek_v3(str(root / "t"))
    t2 = deepseek_v3(str(root / "t2"), seed=1, **SECOND)
    return {"t": t, "d": families.drafter_for(str(root / "d"), t), "t2": t2,
            "d2": families.drafter_for(str(root / "d2"), t2, block_size=16)}


def test_config_layout(models):
    c = TargetConfig.from_dir(models["t"])
    assert c.mla.q_lora_rank == 24 and c.mla.rope_interleave and c.head_dim == 8
    assert (c.moe.num_experts, c.moe.top_k, c.moe.dense_layers, c.moe.n_group, c.moe.topk_group) == (8, 2, [0], 2, 1)
    assert c.moe.shared_intermediate_size == 32 and c.attn_scale == pytest.approx(24 ** -0.5)
    # the compressed cache: one 'head' of kv_lora_rank + qk_rope_head_dim per layer, no separate V
    assert c.cache_layers() == [(1, 40, 0)] * 4
    c2 = TargetConfig.from_dir(models["t2"])
    assert c2.mla.q_lora_rank is None and not c2.mla.rope_interleave and c2.rope.rope_type == "yarn"
    mscale = 0.1 * 0.8 * torch.log(torch.tensor(4.0)).item() + 1
    assert c2.attn_scale == pytest.approx(24 ** -0.5 * mscale ** 2)
    assert (c2.moe.n_group, c2.moe.topk_group, c2.moe.shared_intermediate_size) == (4, 2, 64)


@pytest.mark.parametrize("invariant", [True, False], ids=["cpu_kernels", "pytorch"])
@pytest.mark.parametrize("name", ["t", "t2"])
def test_logits_match_transformers(models, name, invariant):
    # fp32 both sides. transformers expands the latent into per-head keys/values (kv_b_proj) and attends; we
    # absorb kv_b_proj into the query and the output and attend over the latent: a different summation order,
    # measured ~3e-6 relative. The bound is the dense families' 1e-4.
    assert families.max_rel_logit_error(models[name], invariant=invariant) < 1e-4


def test_dflash_equals_ar(models):
    ps = families.prompts(10, seed=3)
    assert families.assert_lossless(models["t"], models["d"], ps) > 0


def test_batched_dflash_equals_ar(models):
    # chunked prefill and a small batch cap mix prefill chunks, verify blocks and queued requests in one step
    ps = families.prompts(8, seed=5, lo=10, hi=60)
    acc = families.assert_lossless(models["t2"], models["d2"], ps, max_tokens=40, draft_lens=(15, 4),
                                   max_num_tokens=48, max_batch_size=3)
    assert acc > 0


def test_compressed_cache_is_allocated(models):
    llm = LLM(target=models["t"], draft=models["d"], max_draft_len=3, draft_len_policy="fixed")
    k, v = llm.engine.runner.target_caches[0]
    assert k.shape[-2:] == (1, 40) and v.numel() == 0


def copy_with(src, dst, **change):
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(change)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f)
    return str(dst)


@pytest.mark.parametrize("change,msg", [
    (dict(n_group=3), "unsupported deepseek_v3 MoE layout"),
    (dict(topk_group=3), "unsupported deepseek_v3 MoE layout"),
    (dict(n_group=4, topk_group=1, num_experts_per_tok=3), "unsupported deepseek_v3 MoE layout"),
    (dict(num_experts_per_tok=9), "unsupported deepseek_v3 MoE layout"),
    (dict(num_key_value_heads=2), "unsupported deepseek_v3 attention layout"),
    (dict(hidden_act="gelu"), "only silu"),
    (dict(quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}),
     "unsupported deepseek_v3 quantization 'fp8'"),
])
def test_bad_layouts_fail_clearly(models, tmp_path, change, msg):
    d = copy_with(models["t"], tmp_path / "bad", **change)
    with pytest.raises(CheckpointError, match=msg) as e:
        TargetConfig.from_dir(d)
    assert "\n" not in str(e.value)


def test_missing_weights_fail_clearly(models, tmp_path):
    from safetensors.torch import load_file, save_file

    d = tmp_path / "missing"
    shutil.copytree(models["t"], d)
    w = load_file(str(d / "model.safetensors"))
    del w["model.layers.2.mlp.gate.e_score_correction_bias"]
    save_file(w, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="e_score_correction_bias"):
        LLM(target=str(d), speculative=False)


def test_kimi_k2_config_runs_as_deepseek_v3(models, tmp_path):
    """Kimi K2's config.json says model_type kimi_k2 (transformers has no such config): read as DeepSeek-V3."""
    from dflash_trt import SamplingParams

    d = copy_with(models["t"], tmp_path / "kimi", model_type="kimi_k2")
    assert TargetConfig.from_dir(d).model_type == "deepseek_v3"
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    ps = families.prompts(2, seed=4)
    outs = [[o.token_ids for o in LLM(target=x, speculative=False).generate(ps, sp)] for x in (d, models["t"])]
    assert outs[0] == outs[1]


@pytest.fixture(scope="module")
def engines(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("deepseek_v3_engines")
    return families.build_engines(models["t"], models["d"], root,
                                  {"bf16": [], "fp8": ["--quantization", "fp8", "--tp-size", "2", "--ep-size", "2",
                                                       "--kv-cache-dtype", "fp8"]})


@pytest.mark.parametrize("name", ["bf16", "fp8"])
def test_engines_build_and_run_losslessly(engines, name):
    e = engines[name]
    with open(os.path.join(e, "engine.json")) as f:
        rec = json.load(f)
    assert rec["model_type"] == "deepseek_v3" and rec["moe"] == {"num_experts": 8, "experts_per_token": 2}
    w = families.target_tensor(e, "model.layers.1.mlp.experts.3.gate_proj.weight")
    assert w.dtype == (torch.float8_e4m3fn if name == "fp8" else torch.bfloat16)  # experts quantized too
    with open(os.path.join(e, "trtllm", "dflash.yaml")) as f:
        yaml = f.read()
    ep = 2 if name == "fp8" else 1
    assert f"moe_expert_parallel_size: {ep}" in yaml
    if name == "fp8":  # FP8 KV cache: ModelOpt writes k_scale / v_scale for MLA; our runtime keeps the model dtype
        with open(os.path.join(e, "target", "hf_quant_config.json")) as f:
            assert json.load(f)["quantization"]["kv_cache_quant_algo"] == "FP8"
        for layer in range(4):
            p = f"model.layers.{layer}.self_attn."
            assert families.target_tensor(e, p + "k_proj.k_scale").numel() == 1
            assert families.target_tensor(e, p + "v_proj.v_scale").numel() == 1
        assert rec["kv_cache_dtype"] == "fp8"
        k, _ = LLM(model=e, speculative=False, dtype="bfloat16", tp_size=1).engine.runner.target_caches[0]
        assert k.dtype == torch.bfloat16
    ps = families.prompts(4, seed=2)
    assert families.assert_lossless(e, None, ps, max_tokens=16, draft_lens=(7,), dtype="bfloat16", tp_size=1) >= 0


def test_tensor_parallel_is_refused(models):
    families.assert_tp_refused(models["t"], "deepseek_v3")


def test_kimi_k2_builds_in_fp8_with_its_own_experts(models, tmp_path):
    """dflash-build's quantization of a model_type kimi_k2 checkpoint (read as DeepSeek-V3): every routed expert
    of the export dequantises to the checkpoint's expert within fp8's precision."""
    from safetensors.torch import load_file

    kimi = copy_with(models["t"], tmp_path / "kimi", model_type="kimi_k2")
    e = families.build_engines(kimi, models["d"], tmp_path, {"kimi_fp8": ["--quantization", "fp8"]})["kimi_fp8"]
    with open(os.path.join(e, "engine.json")) as f:
        assert json.load(f)["model_type"] == "deepseek_v3"
    with open(os.path.join(e, "target", "config.json")) as f:  # TensorRT-LLM's DeepSeek-V3 path, no remote code
        cfg = json.load(f)
    assert (cfg["model_type"], cfg["architectures"]) == ("deepseek_v3", ["DeepseekV3ForCausalLM"])
    src = load_file(os.path.join(kimi, "model.safetensors"))
    out = load_file(os.path.join(e, "target", "model.safetensors"))
    for layer in (1, 3):
        for x in range(8):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                k = f"model.layers.{layer}.mlp.experts.{x}.{proj}.weight"
                assert out[k].dtype == torch.float8_e4m3fn
                deq, ref = out[k].float() * out[k + "_scale"].float(), src[k].float()
                rel = ((deq - ref).abs().max() / ref.abs().max()).item()
                assert rel <= 1 / 16, (k, rel)  # a proper deepseek_v3 build: <= 0.05


def test_build_refuses_a_missing_routed_expert(models, tmp_path, capsys):
    """Every MoE layer's experts are checked from the safetensors headers (a bf16 build never loads the target)."""
    from safetensors.torch import load_file, save_file

    from dflash_trt.builder.cli import main as build

    d = tmp_path / "bad"
    shutil.copytree(models["t"], d)
    w = load_file(str(d / "model.safetensors"))
    k = "model.layers.2.mlp.experts.5.up_proj.weight"  # a middle layer: the shape checks read layers 0 and 3
    del w[k]
    save_file(w, str(d / "model.safetensors"))
    out = tmp_path / "e"
    assert build(["--target", str(d), "--draft", models["d"], "--output", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"weights lack {k} (expert 5 of 8)" in err and err.count("\n") == 1 and not out.exists()


def test_quantization_refuses_weights_transformers_does_not_load(models, tmp_path, capsys):
    """A weight transformers reports missing would be exported randomly initialised: the quantizing build stops
    with one line naming it, before calibration, and writes nothing."""
    pytest.importorskip("modelopt")
    from safetensors.torch import load_file, save_file

    from dflash_trt.builder.cli import main as build

    d = tmp_path / "bad"
    shutil.copytree(models["t"], d)
    w = load_file(str(d / "model.safetensors"))
    k = "model.layers.2.post_attention_layernorm.weight"  # no header check covers it
    del w[k]
    save_file(w, str(d / "model.safetensors"))
    out = tmp_path / "e"
    assert build(["--target", str(d), "--draft", models["d"], "--output", str(out), "--quiet",
                  "--quantization", "fp8"]) == 2
    err = capsys.readouterr().err
    assert f"for quantization (1 missing (e.g. {k}) weights)" in err and err.count("\n") == 1, err
    assert not out.exists() and os.listdir(tmp_path) == ["bad"]  # nor a leftover temporary directory


def test_loading_check_ignores_only_layers_past_the_model():
    """transformers' loading report: missing / unexpected / mis-shaped weights are refused, except the tensors of
    layers past num_hidden_layers (DeepSeek-V3's multi-token-prediction layer), which nothing loads."""
    from dflash_trt.builder.errors import BuildError
    from dflash_trt.builder.quantize import check_loading_info
    from dflash_trt.builder.validate import BuildPlan

    plan = BuildPlan(target="/t", draft="/d", output="/o", target_raw={"num_hidden_layers": 4})
    ok = {"missing_keys": set(), "mismatched_keys": set(), "error_msgs": [],
          "unexpected_keys": {"model.layers.4.eh_proj.weight", "model.layers.4.mlp.experts.down_proj"}}
    check_loading_info(plan, ok, "DeepseekV3ForCausalLM")
    for field, kind, key in (("unexpected_keys", "unexpected", "model.layers.3.mlp.experts.0.up_proj.weight"),
                             ("missing_keys", "missing", "model.layers.3.mlp.experts.gate_up_proj"),
                             ("mismatched_keys", "mis-shaped", "lm_head.weight")):
        info = dict(ok, **{field: ok[field] | {key}})
        with pytest.raises(BuildError, match=rf"for quantization \(1 {kind} \(e\.g\. {re.escape(key)}\) weights\)"):
            check_loading_info(plan, info, "DeepseekV3ForCausalLM")


def test_mis_shaped_mla_weight_is_refused_by_the_builder(models, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    from dflash_trt.builder.cli import main as build

    d = tmp_path / "bad"
    shutil.copytree(models["t"], d)
    w = load_file(str(d / "model.safetensors"))
    k = "model.layers.0.self_attn.kv_b_proj.weight"
    w[k] = w[k][:-1].contiguous()  # one row short: config.json implies [4 x (16 + 16), 32]
    save_file(w, str(d / "model.safetensors"))
    assert build(["--target", str(d), "--draft", models["d"], "--output", str(tmp_path / "e"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"--target weight {k} has shape [127, 32], config.json implies [128, 32]" in err and err.count("\n") == 1


def test_mtp_layers_are_ignored_and_kv_b_proj_is_dropped(models, tmp_path):
    """A release's multi-token-prediction layer (num_nextn_predict_layers, model.layers.<L>.*) is not loaded: the
    same tokens as without it. kv_b_proj is absorbed at load: its own parameter keeps no storage."""
    from safetensors.torch import load_file, save_file

    from dflash_trt import SamplingParams
    from dflash_trt.loader import ModelPaths, load_models

    d = tmp_path / "mtp"
    shutil.copytree(models["t"], d)
    w = load_file(str(d / "model.safetensors"))
    for k in [k for k in w if k.startswith("model.layers.3.")]:
        w[k.replace("model.layers.3.", "model.layers.4.")] = w[k].clone()
    w["model.layers.4.eh_proj.weight"] = torch.randn(64, 128)
    w["model.layers.4.enorm.weight"] = torch.ones(64)
    save_file(w, str(d / "model.safetensors"))
    families.tiny.edit_json(str(d / "config.json"), num_nextn_predict_layers=1)
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    ps = families.prompts(2, seed=4)
    outs = [[o.token_ids for o in LLM(target=x, speculative=False).generate(ps, sp)] for x in (str(d), models["t"])]
    assert outs[0] == outs[1]
    m, _ = load_models(ModelPaths(str(d), None), TargetConfig.from_dir(str(d)), None, torch.float32, "cpu")
    kv_b = [p for n, p in m.named_parameters() if "kv_b_proj" in n]
    assert len(kv_b) == 4 and all(p.numel() == 0 for p in kv_b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interleaved_rope_is_transformers_bit_for_bit(models, dtype):
    """rope_interleave: our fixed permutation then the rotate-half rope gives transformers' interleaved rope
    (apply_rotary_pos_emb_interleave) bit for bit, for q and k: so are the dot products attention takes."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import apply_rotary_pos_emb_interleave

    from dflash_trt.models.deepseek_v3 import MlaAttention
    from dflash_trt.rope import RotaryTable, apply_rope

    cfg = TargetConfig.from_dir(models["t"])
    att = MlaAttention(cfg, 0)
    r = cfg.mla.qk_rope_head_dim
    assert att.rope_perm is not None and r == 8
    g = torch.Generator().manual_seed(0)
    t = 300
    q, k = torch.randn(t, 4, r, generator=g).to(dtype), torch.randn(t, 1, r, generator=g).to(dtype)
    cos, sin = RotaryTable(cfg.rope, r, t)(torch.arange(t), dtype)
    ours = [apply_rope(x.index_select(-1, att.rope_perm), cos, sin) for x in (q, k)]
    # transformers: [batch, heads, seq, dim] with cos/sin [batch, seq, dim]
    ref = apply_rotary_pos_emb_interleave(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    for a, b in zip(ours, ref):
        assert torch.equal(a, b[0].transpose(0, 1))
