"""dflash-build for hybrid Gated DeltaNet targets: the multimodal Qwen3.5 / Qwen3.5-MoE wrappers (served
text-only) and Qwen3-Next, with drafters laid out as the published ones (5-8 layers, 5-8 target taps, layer_types
mixing sliding_attention and full_attention, block sizes 10 and 16). Pair validation through the wrapper prefix,
bf16 / FP8 / NVFP4 engines that run on the native runtime (DFlash == AR) and pass --check, what ModelOpt keeps
unquantized and why, the TensorRT-LLM settings these targets need, one-line refusals."""
import json
import os
import shutil

import pytest
import torch

import families
import test_families_qwen3_5 as hyb
from dflash_trt.builder.cli import main as build

VISION = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64)
SLIDING = dict(sliding_window=16, use_sliding_window=True)
# kind: (target layers, drafter: layers, block size, taps, layer_types)
PAIRS = {"qwen3_5": (8, 6, 16, list(range(8)), ["sliding_attention"] * 5 + ["full_attention"]),
         "qwen3_5_moe": (6, 5, 10, list(range(6)), ["sliding_attention"] * 4 + ["full_attention"]),
         "qwen3_next": (6, 8, 16, [0, 1, 2, 4, 5], None)}
# bf16 engines copy the checkpoint (the qwen3_5 one stands for all three; test_hybrid_engine runs the families
# themselves); every family's FP8 export, and an NVFP4 one, run natively
BUILDS = {"qwen3_5_bf16": ("qwen3_5", []), "qwen3_5_fp8": ("qwen3_5", ["--quantization", "fp8"]),
          "qwen3_5_nvfp4": ("qwen3_5", ["--quantization", "nvfp4"]),
          "qwen3_5_moe_fp8": ("qwen3_5_moe", ["--quantization", "fp8"]),
          "qwen3_next_fp8": ("qwen3_next", ["--quantization", "fp8"])}


def target(kind: str, path: str, layers: int) -> str:
    import transformers as tf

    torch.manual_seed(0)
    base = dict(hyb.BASE, num_hidden_layers=layers)
    if kind == "qwen3_5":  # Qwen3_5ForConditionalGeneration: text under model.language_model., a vision tower
        cfg = tf.Qwen3_5Config(text_config=dict(base, full_attention_interval=2), vision_config=VISION)
        model = tf.Qwen3_5ForConditionalGeneration(cfg)
    elif kind == "qwen3_5_moe":
        cfg = tf.Qwen3_5MoeConfig(text_config=dict(base, **hyb.MOE), vision_config=VISION)
        model = tf.Qwen3_5MoeForConditionalGeneration(cfg)
    else:  # one dense layer, unnormalised top-k weights, the grouped in_proj_qkvz / in_proj_ba
        model = tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(**base, **hyb.MOE, mlp_only_layers=[1],
                                                           norm_topk_prob=False))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "dt_bias" in n:
                p.add_(torch.randn_like(p) * 0.1)
    return families.save_hf(model, path)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid_pairs")
    out = {}
    for kind, (layers, d_layers, block, taps, types) in PAIRS.items():
        t = target(kind, str(root / kind), layers)
        extra = None if types is None else dict(layer_types=types, **SLIDING)
        out[kind] = (t, families.drafter_for(str(root / f"{kind}_d"), t, block_size=block, layers=d_layers,
                                             target_layer_ids=taps, extra=extra))
    return out


@pytest.fixture(scope="module")
def engines(pairs, tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid_engines")
    out = {}
    for name, (kind, flags) in BUILDS.items():
        extra = ["--calib-samples", "2"] if flags else []
        out.update(families.build_engines(*pairs[kind], root, {name: flags + extra}))
    return out


def _names(engine):
    from safetensors import safe_open

    with safe_open(os.path.join(engine, "target", "model.safetensors"), "pt") as f:
        return {k: f.get_slice(k).get_dtype() for k in f.keys()}


def test_published_drafter_layouts_are_accepted(engines, pairs):
    for name, kind in (("qwen3_5_bf16", "qwen3_5"), ("qwen3_5_moe_fp8", "qwen3_5_moe"),
                       ("qwen3_next_fp8", "qwen3_next")):
        _, d_layers, block, taps, types = PAIRS[kind]
        with open(os.path.join(engines[name], "engine.json")) as f:
            rec = json.load(f)
        assert (rec["block_size"], rec["max_draft_len"], rec["target_layer_ids"]) == (block, block - 1, taps)
        assert rec["model_type"] == kind and rec["linear_attention_layers"]
        with open(os.path.join(engines[name], "draft", "config.json")) as f:
            d = json.load(f)
        assert d["num_hidden_layers"] == d_layers and d.get("layer_types") == types


def test_every_engine_passes_check(engines, capsys):
    for e in engines.values():
        assert build(["--check", e, "--quiet"]) == 0, capsys.readouterr().err


def test_engines_run_natively(engines):
    accepted = 0
    for name, e in engines.items():
        ps = families.prompts(2, seed=3)
        accepted += families.assert_lossless(e, None, ps, max_tokens=8, draft_lens=(7,), dtype="bfloat16")
    assert accepted > 0


def test_what_is_quantized_and_what_is_kept(engines):
    """FP8: ModelOpt's defaults (the Gated DeltaNet's in_proj_qkv / z and out_proj FP8, as in NVIDIA's Qwen3.6
    checkpoints; conv1d, in_proj_a / b, routers, vision BF16). NVFP4: the MLPs only, the linear-attention and
    attention projections BF16 (NVIDIA's Qwen3.6 NVFP4 keeps them out of NVFP4); engine.json says why."""
    p = "model.language_model.layers."
    fp8, nv = _names(engines["qwen3_5_fp8"]), _names(engines["qwen3_5_nvfp4"])
    for proj in ("in_proj_qkv", "in_proj_z", "out_proj"):
        assert fp8[f"{p}0.linear_attn.{proj}.weight"] == "F8_E4M3"
        assert nv[f"{p}0.linear_attn.{proj}.weight"] == "BF16"
    for proj in ("in_proj_a", "in_proj_b", "conv1d"):
        assert fp8[f"{p}0.linear_attn.{proj}.weight"] == nv[f"{p}0.linear_attn.{proj}.weight"] == "BF16"
    assert fp8[f"{p}1.self_attn.q_proj.weight"] == "F8_E4M3" and nv[f"{p}1.self_attn.q_proj.weight"] == "BF16"
    assert fp8[f"{p}0.mlp.down_proj.weight"] == "F8_E4M3" and nv[f"{p}0.mlp.down_proj.weight"] == "U8"
    assert all(v in ("BF16", "F32") for k, v in nv.items() if k.startswith("model.visual."))
    moe = _names(engines["qwen3_5_moe_fp8"])
    assert moe[f"{p}0.mlp.experts.3.up_proj.weight"] == "F8_E4M3"
    assert moe[f"{p}0.mlp.gate.weight"] == moe[f"{p}0.mlp.shared_expert_gate.weight"] == "BF16"
    nxt = _names(engines["qwen3_next_fp8"])
    assert nxt["model.layers.0.linear_attn.in_proj_qkvz.weight"] == "F8_E4M3"
    assert nxt["model.layers.0.linear_attn.in_proj_ba.weight"] == "BF16"
    with open(os.path.join(engines["qwen3_5_nvfp4"], "engine.json")) as f:
        kept = json.load(f)["modelopt"]["kept_unquantized"]
    assert any("linear_attn" in k["modules"] and "Qwen3.6" in k["why"] for k in kept)


def test_tensorrt_llm_settings_for_the_hybrid_cache(engines):
    """As TensorRT-LLM's own Qwen3.5 DFlash test runs it: no block reuse, no chunked prefill; the recurrent state
    fp32. Attention-only targets keep chunked prefill (test_builder's dflash.yaml checks)."""
    from dflash_trt.builder.trtllm_schema import problems

    yaml = pytest.importorskip("yaml")
    for name in ("qwen3_5_bf16", "qwen3_next_fp8"):
        with open(os.path.join(engines[name], "trtllm", "dflash.yaml")) as f:
            opts = yaml.safe_load(f)
        assert problems(opts) == []
        assert opts["enable_chunked_prefill"] is False
        assert opts["kv_cache_config"]["enable_block_reuse"] is False
        assert opts["kv_cache_config"]["mamba_ssm_cache_dtype"] == "float32"


def test_unsupported_combinations_are_refused(pairs, tmp_path, capsys):
    t, d = pairs["qwen3_5_moe"]
    families.assert_build_refused(capsys, ["--target", t, "--draft", d, "--output", str(tmp_path / "tp"), "--tp-size", "2"],
                    "--tp-size 2 is not supported for qwen3_5_moe: tensor parallelism does not shard the Gated "
                    "DeltaNet layers")
    families.assert_build_refused(capsys, ["--target", t, "--draft", d, "--output", str(tmp_path / "reuse"), "--kv-cache-reuse"],
                    "--kv-cache-reuse is not supported for qwen3_5_moe")
    families.assert_build_refused(capsys, ["--target", t, "--draft", d, "--output", str(tmp_path / "tok"), "--max-seq-len", "512",
                             "--max-num-tokens", "256"], "--max-num-tokens 256 is below --max-seq-len 512")
    # NVFP4 packs 16-element blocks: the shared expert's 24-wide down_proj input cannot be
    families.assert_build_refused(capsys, ["--target", t, "--draft", d, "--output", str(tmp_path / "nv"), "--quantization",
                             "nvfp4"], "shared_expert_intermediate_size (shared down_proj in_features per rank) is 24")


def test_weight_checks_read_the_wrapper_prefix(pairs, tmp_path, capsys):
    """A truncated hybrid checkpoint is refused from the headers, the tensor named as the checkpoint spells it."""
    from safetensors.torch import load_file, save_file

    for kind, key, msg in (
            ("qwen3_5_moe", "model.language_model.layers.2.mlp.experts.5.up_proj.weight", " (expert 5 of 8)"),
            ("qwen3_5", "model.language_model.layers.0.linear_attn.in_proj_qkv.weight", ": the safetensors do not"),
            ("qwen3_next", "model.layers.3.self_attn.q_proj.weight", ": the safetensors do not")):
        t, d = pairs[kind]
        bad = tmp_path / f"{kind}_bad"
        shutil.copytree(t, bad)
        w = load_file(str(bad / "model.safetensors"))
        del w[key]
        save_file(w, str(bad / "model.safetensors"))
        families.assert_build_refused(capsys, ["--target", str(bad), "--draft", d, "--output", str(tmp_path / f"{kind}_e")],
                        f"weights lack {key}{msg}")
