"""dflash-build for Kimi K2.5 / K2.6 (`kimi_k25`, the multimodal wrapper served text-only) and MiniMax-M2 targets:
weight checks through the wrapper prefix and the Mixtral expert names, bf16 / FP8 / NVFP4 engines that run on the
native runtime (DFlash == AR) and pass --check, the layout and names TensorRT-LLM reads, EP settings, what stays
unquantized, one-line refusals. Tiny random targets from transformers' own classes (the family tests' builders)."""
import json
import os
import shutil

import pytest

import families
import test_families_kimi_k25 as kimi
import test_families_minimax_m2 as minimax
from dflash_trt.builder.cli import main as build

BUILDS = {"kimi_bf16": ("kimi", []),
          "kimi_fp8": ("kimi", ["--quantization", "fp8", "--tp-size", "2", "--ep-size", "2"]),
          "kimi_nvfp4": ("kimi", ["--quantization", "nvfp4"]),
          "minimax_bf16": ("minimax", ["--tp-size", "2", "--ep-size", "2"]),
          "minimax_fp8": ("minimax", ["--quantization", "fp8"]),
          "minimax_nvfp4": ("minimax", ["--quantization", "nvfp4"])}
CALIB = ["--calib-samples", "2"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo_pairs")
    k = kimi.kimi_k25(str(root / "kt"))
    m = minimax.minimax_m2(str(root / "mt"))
    return {"kimi": (k, families.drafter_for(str(root / "kd"), k)),
            "minimax": (m, families.drafter_for(str(root / "md"), m))}


@pytest.fixture(scope="module")
def engines(pairs, tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo_engines")
    out = {}
    for name, (fam, flags) in BUILDS.items():
        t, d = pairs[fam]
        out.update(families.build_engines(t, d, root, {name: flags + (CALIB if "--quantization" in flags else [])}))
    return out


def _record(engine):
    with open(os.path.join(engine, "engine.json")) as f:
        return json.load(f)


def _names(engine):
    from safetensors import safe_open

    with safe_open(os.path.join(engine, "target", "model.safetensors"), "pt") as f:
        return {k: f.get_slice(k).get_dtype() for k in f.keys()}


def test_every_engine_passes_check(engines, capsys):
    for e in engines.values():
        assert build(["--check", e, "--quiet"]) == 0, capsys.readouterr().err


# NVFP4 engines are dequantised at load like FP8 ones (test_quantized covers that path); bf16 and FP8 run here
@pytest.mark.parametrize("name", ["kimi_bf16", "kimi_fp8", "minimax_bf16", "minimax_fp8"])
def test_engine_runs_natively(engines, name):
    e = engines[name]
    ps = families.prompts(2, seed=2)
    # tp_size 1: the native runtime runs these families unsharded whatever the TensorRT-LLM files say
    assert families.assert_lossless(e, None, ps, max_tokens=10, draft_lens=(7,), dtype="bfloat16", tp_size=1) > 0


@pytest.mark.parametrize("name", ["kimi_bf16", "kimi_fp8", "kimi_nvfp4"])
def test_kimi_target_is_in_the_layout_tensorrt_llm_reads(engines, pairs, name):
    """TensorRT-LLM's KimiK25ForConditionalGeneration (the release's spelling) strips `language_model.` and hands
    the rest to DeepSeek-V3: the language model goes under language_model.model.layers.* whatever the source's
    layout (transformers' save_pretrained wrote `blocks`, ModelOpt's export writes `model.language_model.*`); the
    vision tower and projector stay as released, in BF16."""
    e = engines[name]
    names = _names(e)
    src = _names_of(pairs["kimi"][0])
    assert any(n.startswith("language_model.model.blocks.") for n in src)  # the source is transformers' layout
    lang = [n for n in names if n.startswith("language_model.")]
    assert "language_model.lm_head.weight" in names and "language_model.model.embed_tokens.weight" in names
    assert all(n.startswith(("language_model.model.layers.", "language_model.model.embed_tokens",
                             "language_model.model.norm", "language_model.lm_head")) for n in lang), lang
    vision = sorted(n for n in names if not n.startswith("language_model."))
    assert vision == sorted(n for n in src if not n.startswith("language_model.")) and vision
    assert all(names[n] in ("BF16", "F32") for n in vision)
    with open(os.path.join(e, "target", "config.json")) as f:
        assert json.load(f)["architectures"] == ["KimiK25ForConditionalGeneration"]
    if name != "kimi_bf16":  # exclude lists renamed the same way, so TensorRT-LLM's remap finds the modules
        with open(os.path.join(e, "target", "hf_quant_config.json")) as f:
            excl = json.load(f)["quantization"]["exclude_modules"]
        assert "language_model.lm_head" in excl and "vision_tower*" in excl and "mm_projector*" in excl
        assert not [m for m in excl if m.startswith("model.")], excl


def _names_of(target):
    from safetensors import safe_open

    with safe_open(os.path.join(target, "model.safetensors"), "pt") as f:
        return {k: f.get_slice(k).get_dtype() for k in f.keys()}


def test_kimi_built_target_builds_again(engines, pairs, tmp_path):
    """The release layout (language_model.model.layers.*, KimiK25ForConditionalGeneration) is a valid --target:
    the bf16 engine's own target/ rebuilds to the same tensors."""
    again = families.build_engines(os.path.join(engines["kimi_bf16"], "target"), pairs["kimi"][1], tmp_path,
                                   {"again": []})["again"]
    assert _names(again) == _names(engines["kimi_bf16"])


@pytest.mark.parametrize("name,quantized,kept", [
    ("kimi_fp8", ".mlp.experts.3.gate_proj.weight", ".mlp.gate.weight"),
    ("kimi_nvfp4", ".mlp.experts.3.gate_proj.weight", ".mlp.gate.weight"),
    ("minimax_fp8", ".block_sparse_moe.experts.3.w1.weight", ".block_sparse_moe.gate.weight"),
    ("minimax_nvfp4", ".block_sparse_moe.experts.3.w1.weight", ".self_attn.q_proj.weight")])
def test_what_is_quantized_and_what_is_kept(engines, name, quantized, kept):
    """FP8: ModelOpt's default scope (attention and experts; routers, lm_head, vision kept). NVFP4: routed experts
    only, as NVIDIA's NVFP4 MoE releases; engine.json says what stays unquantized and why."""
    e, nvfp4 = engines[name], name.endswith("nvfp4")
    prefix = "language_model.model.layers.1" if name.startswith("kimi") else "model.layers.1"
    names = _names(e)
    assert names[prefix + quantized] == ("U8" if nvfp4 else "F8_E4M3")
    attn = prefix + (".self_attn.q_b_proj.weight" if name.startswith("kimi") else ".self_attn.q_proj.weight")
    assert names[attn] == ("BF16" if nvfp4 else "F8_E4M3")
    assert names[prefix + kept] in ("BF16", "F32")
    rec = _record(e)
    kept_list = rec["modelopt"]["kept_unquantized"]
    assert any("routers" in k["modules"] for k in kept_list) and all(k["why"] for k in kept_list)
    if nvfp4:
        assert any(k["modules"].startswith("attention") and "experts" in k["why"] for k in kept_list)
    if name.startswith("kimi"):
        assert any("mm_projector" in k["modules"] for k in kept_list)
        shared = names[prefix + ".mlp.shared_experts.gate_proj.weight"]
        assert shared == ("BF16" if nvfp4 else "F8_E4M3")


def test_expert_parallel_settings(engines):
    for name, ep in (("kimi_fp8", 2), ("kimi_bf16", 1), ("minimax_bf16", 2)):
        e = engines[name]
        with open(os.path.join(e, "trtllm", "dflash.yaml")) as f:
            assert f"moe_expert_parallel_size: {ep}" in f.read()
        with open(os.path.join(e, "trtllm", "serve.sh")) as f:
            assert f"--ep_size {ep}" in f.read()
        rec = _record(e)
        assert rec["ep_size"] == ep and rec["moe"]["num_experts"] == 8


def test_weight_checks_read_the_checkpoint_names(pairs, tmp_path, capsys):
    """A missing routed expert in a middle layer is found through the wrapper prefix (Kimi, transformers' `blocks`
    layout) and the Mixtral names (MiniMax-M2), and named as the checkpoint spells it."""
    from safetensors.torch import load_file, save_file

    for fam, key in (("kimi", "language_model.model.blocks.1.mlp.experts.5.up_proj.weight"),
                     ("minimax", "model.layers.2.block_sparse_moe.experts.5.w3.weight")):
        t, d = pairs[fam]
        bad = tmp_path / f"{fam}_bad"
        shutil.copytree(t, bad)
        w = load_file(str(bad / "model.safetensors"))
        del w[key]
        save_file(w, str(bad / "model.safetensors"))
        families.assert_build_refused(capsys, ["--target", str(bad), "--draft", d, "--output", str(tmp_path / f"{fam}_e")],
                        f"weights lack {key} (expert 5 of 8)")
    bad = tmp_path / "kimi_shape"
    shutil.copytree(pairs["kimi"][0], bad)
    w = load_file(str(bad / "model.safetensors"))
    k = "language_model.model.blocks.0.self_attn.kv_b_proj.weight"
    w[k] = w[k][:-1].contiguous()
    save_file(w, str(bad / "model.safetensors"))
    families.assert_build_refused(capsys, ["--target", str(bad), "--draft", pairs["kimi"][1], "--output", str(tmp_path / "ks")],
                    f"--target weight {k} has shape [127, 32], config.json implies [128, 32]")


def test_unsupported_combinations_are_refused(pairs, tmp_path, capsys):
    kt, kd = pairs["kimi"]
    families.assert_build_refused(capsys, ["--target", kt, "--draft", kd, "--output", str(tmp_path / "e1"), "--tp-size", "4",
                             "--ep-size", "3"], "--ep-size 3 must divide --tp-size 4")
    mt, md = pairs["minimax"]
    families.assert_build_refused(capsys, ["--target", mt, "--draft", md, "--output", str(tmp_path / "e2"), "--tp-size", "8",
                             "--ep-size", "8"], "--tp-size 8 does not divide the target num_attention_heads (4)")
    int4 = tmp_path / "kimi_int4"  # the release's INT4 experts (compressed-tensors): give the bf16 checkpoint
    shutil.copytree(kt, int4)
    with open(int4 / "config.json") as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "compressed-tensors"}
    with open(int4 / "config.json", "w") as f:
        json.dump(cfg, f)
    families.assert_build_refused(capsys, ["--target", str(int4), "--draft", kd, "--output", str(tmp_path / "e3")],
                    "is already quantized: give the original bf16/fp16 checkpoint")


# -- drafters in vLLM's speculators format -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def speculators_pair(tmp_path_factory):
    import test_speculators_format as spec
    import tiny

    root = tmp_path_factory.mktemp("zoo_speculators")
    t, _ = tiny.accepting_pair(str(root), layers=4)
    z = tiny.make_drafter(str(root / "z"), t, block_size=8, mask_token_id=tiny.mask_proposing(t, 11),
                          residual_scale=0.3, target_layer_ids=spec.IDS)
    return t, z, spec.to_speculators(z, t, str(root / "s")), root


def test_speculators_drafter_is_written_in_the_zlab_layout(speculators_pair, tmp_path):
    """TensorRT-LLM's DFlashForCausalLM reads block_size at top level and mask_token_id / 0-based target_layer_ids
    in dflash_config, and shares the target's embedding and head: the speculators drafter (taps as hidden_states
    indices, [1, 3]) is written so ([0, 2]), without the verifier's rows, and drafts as the z-lab drafter does."""
    import test_speculators_format as spec
    from safetensors import safe_open

    t, z, s, _ = speculators_pair
    e = families.build_engines(t, s, tmp_path, {"e": []})["e"]
    with open(os.path.join(e, "draft", "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(z, "config.json")) as f:
        ref = json.load(f)
    assert cfg["dflash_config"] == {"mask_token_id": ref["dflash_config"]["mask_token_id"],
                                    "target_layer_ids": spec.IDS}
    assert (cfg["block_size"], cfg["architectures"], cfg["model_type"]) == (8, ["DFlashDraftModel"], "qwen3")
    assert not [k for k in cfg if k.startswith(("speculators", "aux_", "transformer_layer"))]
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "rms_norm_eps", "vocab_size"):
        assert cfg[k] == ref[k], k
    with safe_open(os.path.join(e, "draft", "model.safetensors"), "pt") as f:
        got = set(f.keys())
    with safe_open(os.path.join(z, "model.safetensors"), "pt") as f:
        assert got == set(f.keys())  # the body only: no embed_tokens / lm_head / d2t / t2d
    assert _record(e)["target_layer_ids"] == spec.IDS
    ps = spec.tiny_prompts(4, seed=1)
    ref_traces = spec.traces(t, z, ps, dtype="bfloat16")
    assert spec.traces(os.path.join(e, "target"), os.path.join(e, "draft"), ps, dtype="bfloat16") == ref_traces
    assert sum(a for _, tr in ref_traces for _, a in tr) > 0


def test_speculators_pruned_vocabulary_is_refused(speculators_pair, tmp_path, capsys):
    """TensorRT-LLM's DFlash drafter reads no d2t / t2d (it drafts over the target's whole head): refused."""
    import test_speculators_format as spec
    import tiny

    t, z, _, root = speculators_pair
    vocab = torch_tensor(sorted({11} | set(range(3, tiny.VOCAB, 3))))
    s = spec.to_speculators(z, t, str(tmp_path / "pruned"), vocab)
    families.assert_build_refused(capsys, ["--target", t, "--draft", s, "--output", str(tmp_path / "e")],
                    f"--draft has a pruned draft vocabulary (draft_vocab_size {vocab.numel()} of the target's "
                    f"{tiny.VOCAB}")


def torch_tensor(x):
    import torch

    return torch.tensor(x)


def test_dflash2_pair_serves_natively_without_tensorrt_llm_files(tmp_path, capsys):
    """TensorRT-LLM has only an RFC for DFlash2: the build writes no trtllm/ files and says in one line where the
    directory serves (natively, vLLM, SGLang); --check and the native runtime take it."""
    import test_dflash2

    t, d = test_dflash2.make_pair(tmp_path)
    out = str(tmp_path / "e")
    capsys.readouterr()
    assert build(["--target", t, "--draft", d, "--output", out, "--quiet"]) == 0
    err = capsys.readouterr().err
    note = [line for line in err.splitlines() if line.startswith("note: TensorRT-LLM")]
    assert len(note) == 1 and "serves natively" in note[0] and "vllm/serve.sh, sglang/serve.sh" in note[0]
    assert not os.path.exists(os.path.join(out, "trtllm")) and _record(out)["stacks"] == ["vllm", "sglang"]
    assert build(["--check", out, "--quiet"]) == 0
    ps = test_dflash2.prompts(2, seed=4)
    assert families.assert_lossless(out, None, ps, max_tokens=10, draft_lens=(7,)) >= 0


def test_kimi_k26_drafter_with_deepseek_yarn_rope_builds_and_runs(pairs, tmp_path):
    """Kimi K2.6's published drafter uses `deepseek_yarn` RoPE (vLLM's DeepseekScalingRotaryEmbedding): its
    table is transformers' YaRN with mscale / mscale_all_dim, and vLLM's defaults (mscale 1, mscale_all_dim 0)
    when they are absent; the pair builds, re-checks and stays lossless."""
    import math

    import torch

    from dflash_trt.config import RopeConfig
    from dflash_trt.rope import RotaryTable
    from transformers import DeepseekV3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_theta": 50000.0, "factor": 64.0, "original_max_position_embeddings": 4096, "mscale": 0.707,
              "mscale_all_dim": 0.707, "beta_fast": 32.0, "beta_slow": 1.0}
    hf = DeepseekV3Config(qk_rope_head_dim=64, max_position_embeddings=262144,
                          rope_parameters=dict(params, rope_type="yarn"))
    inv_ref, attn_ref = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    ours = RotaryTable(RopeConfig.from_hf(dict(params, rope_type="deepseek_yarn")), 64, 8)
    assert torch.allclose(ours.inv_freq, inv_ref.float(), rtol=1e-6) and ours.scale == pytest.approx(attn_ref)
    bare = RotaryTable(RopeConfig.from_hf({k: v for k, v in dict(params, rope_type="deepseek_yarn").items()
                                           if not k.startswith("mscale")}), 64, 8)
    assert bare.scale == pytest.approx(0.1 * math.log(64.0) + 1.0)  # vLLM: mscale(64, 1) / mscale(64, 0)
    t, d = pairs["kimi"]
    k26 = tmp_path / "k26"
    shutil.copytree(d, k26)
    with open(k26 / "config.json") as f:
        cfg = json.load(f)
    cfg["rope_parameters"] = {"rope_type": "deepseek_yarn", "rope_theta": 50000.0, "factor": 64.0,
                              "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 1.0}
    with open(k26 / "config.json", "w") as f:
        json.dump(cfg, f)
    out = str(tmp_path / "e")
    assert build(["--target", t, "--draft", str(k26), "--output", out, "--quiet"]) == 0
    assert build(["--check", out, "--quiet"]) == 0
    assert families.assert_lossless(out, None, families.prompts(2, seed=26), max_tokens=8, draft_lens=(7,)) >= 0


# -- Gemma 4 (dense with per-layer embeddings and shared-KV layers; the MoE wrapper with K=V attention) ------------
@pytest.fixture(scope="module")
def gemma4_engines(tmp_path_factory):
    g = pytest.importorskip("test_families_gemma4")
    root = tmp_path_factory.mktemp("zoo_gemma4")
    dense, moe = g.gemma4_dense(str(root / "dense")), g.gemma4_moe(str(root / "moe"))
    out = families.build_engines(dense, g.gemma4_drafter(str(root / "dense_d"), dense), root, {"dense_bf16": []})
    out |= families.build_engines(moe, g.gemma4_drafter(str(root / "moe_d"), moe), root,
                                  {"moe_fp8": ["--quantization", "fp8"] + CALIB})
    return out


def test_gemma4_engines_build_check_and_run(gemma4_engines, capsys):
    """The weight checks read Gemma 4's per-layer MLP widths (double-wide shared-KV layers), the wrapper's
    model.language_model. prefix and its experts beside the dense MLP (`experts.gate_up_proj`, `router.proj`);
    the FP8 export keeps the router BF16; TensorRT-LLM's target attention is TRTLLM, which Gemma 4 needs with
    DFlash (head_dim 256 selects FlashInfer otherwise, which rejects K+1-token queries)."""
    for name, e in gemma4_engines.items():
        assert build(["--check", e, "--quiet"]) == 0, capsys.readouterr().err
        with open(os.path.join(e, "trtllm", "dflash.yaml")) as f:
            assert "attn_backend: TRTLLM" in f.read()
        ps = families.prompts(2, seed=5)
        assert families.assert_lossless(e, None, ps, max_tokens=8, draft_lens=(7,), dtype="bfloat16") > 0
    names = _names(gemma4_engines["moe_fp8"])
    p = "model.language_model.layers.0."
    assert names[p + "experts.0.gate_proj.weight"] == names[p + "self_attn.q_proj.weight"] == "F8_E4M3"
    assert names[p + "router.proj.weight"] == "BF16"
