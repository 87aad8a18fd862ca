"""gpt-oss targets: sinks, alternating sliding/full attention, YaRN, clamped-SwiGLU MoE, MXFP4 experts."""
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import families
import tiny
from dflash_trt.config import DraftConfig, TargetConfig, validate_pair
from dflash_trt.errors import CheckpointError

WINDOW = 8


def gpt_oss(path, seed=0, **over):
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(seed)
    kw = dict(vocab_size=families.VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
              sliding_window=WINDOW, max_position_embeddings=131072, initializer_range=0.2, bos_token_id=1,
              eos_token_id=2, pad_token_id=0, swiglu_limit=1.5)  # a low limit so the clamps bind
    kw.update(over)
    model = GptOssForCausalLM(GptOssConfig(**kw))
    with torch.no_grad():  # transformers zero-inits expert biases: give them values so they are tested
        for n, p in model.named_parameters():
            if n.endswith("_proj_bias"):
                p.normal_(0, 0.2)
    return families.save_hf(model, path)


# z-lab/gpt-oss-20b-DFlash's config.json layout: block_size 8 at the top level, mask_token_id / target_layer_ids
# in dflash_config, YaRN as `rope_scaling` with rope_theta beside it, attention biases
RELEASE_ROPE = {"rope_theta": 150000.0, "max_position_embeddings": 131072,
                "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}}


def gpt_oss_drafter(path, target, **over):
    """The gpt-oss drafter conventions (RELEASE_ROPE, attention biases, block size 8, the mask id nested in
    dflash_config), plus a sliding-window layer (use_sliding_window: the reference's Qwen3Config drops
    sliding_window without it). over: config.json entries to change."""
    d = families.drafter_for(path, target, block_size=8, extra={
        **RELEASE_ROPE, "attention_bias": True, "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": WINDOW, "use_sliding_window": True, **over})
    w = load_file(os.path.join(d, "model.safetensors"))
    g = torch.Generator().manual_seed(7)
    for k in [k for k in w if k.endswith("_proj.weight") and ".self_attn." in k]:
        w[k[:-len("weight")] + "bias"] = torch.randn(w[k].shape[0], generator=g) * 0.05
    save_file(w, os.path.join(d, "model.safetensors"))
    return d


def gpt_oss_release_drafter(path, target):
    """gpt_oss_drafter with config.json laid out as z-lab/gpt-oss-20b-DFlash ships it (a verbatim copy of the
    release's config.json, dated 2026-04-20, in Osaurus' DFlashDrafterForwardTests.swift): architectures
    DFlashDraftModel but model_type "gpt_oss" with the target's initial_context_length (a config derived from the
    target's GptOssConfig), every layer full attention, no num_target_layers."""
    d = gpt_oss_drafter(path, target, model_type="gpt_oss", initial_context_length=4096,
                        layer_types=["full_attention"] * 2, use_sliding_window=False)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    del cfg["num_target_layers"]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return d


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt_oss")
    t = gpt_oss(str(root / "t"))
    return {"t": t, "d": gpt_oss_drafter(str(root / "d"), t), "root": root}


def test_config_layout(models):
    c = TargetConfig.from_dir(models["t"])
    assert c.moe.router == "topk_softmax" and c.moe.bias and c.moe.swiglu_limit == 1.5
    assert [c.window(i) for i in range(4)] == [WINDOW, None, WINDOW, None] and c.rope.rope_type == "yarn"
    d = DraftConfig.from_dir(models["d"])
    assert d.block_size == 8 and d.layer_types[0] == "sliding_attention" and d.sliding_window == WINDOW
    # the release's rope_scaling + top-level rope_theta, its attention biases, its nested mask id
    r = d.rope
    assert (r.rope_type, r.theta, r.factor, r.original_max_position_embeddings) == ("yarn", 150000.0, 32.0, 4096)
    with open(os.path.join(models["d"], "config.json")) as f:
        raw = json.load(f)
    assert "mask_token_id" not in raw and d.mask_token_id == raw["dflash_config"]["mask_token_id"]
    assert d.attention_bias and d.target_layer_ids == raw["dflash_config"]["target_layer_ids"]
    validate_pair(c, d, max_draft_len=7)  # the pair is accepted as published: 7 drafts per block of 8


def test_drafter_matches_zlab_reference(models):
    """The release-layout drafter on the gpt-oss target runs as the z-lab reference runs it: same tokens, drafts
    and acceptance lengths, first-step logits within 1e-3 (YaRN from rope_scaling, attention biases, the window
    layer over a 30-token context)."""
    pytest.importorskip("dflash.model", reason="z-lab reference `dflash` not installed")
    from test_zlab_parity import check_against_reference

    check_against_reference(models["t"], models["d"], families.prompts(1, seed=1, lo=30, hi=31)[0])


@pytest.mark.parametrize("invariant", [True, False], ids=["cpu_kernels", "pytorch"])
def test_logits_match_transformers(models, invariant):
    # fp32 both sides. Our sinks enter the softmax as an extra key (score sink/scale*scale, 1 ulp off) and
    # experts run split instead of fused; both are ~1e-6 relative. 150-token rows span many windows of 8.
    assert families.max_rel_logit_error(models["t"], invariant=invariant) < 1e-4


def test_sinks_matter(models, tmp_path):
    """Zeroing the sinks changes the logits (so the test above checks them)."""
    from dflash_trt.loader import ModelPaths, load_models
    from dflash_trt.teacher import teacher_forward

    d = tmp_path / "nosink"
    shutil.copytree(models["t"], d)
    w = load_file(str(d / "model.safetensors"))
    for k in w:
        if k.endswith("sinks"):
            w[k] = w[k] + 3.0
    save_file(w, str(d / "model.safetensors"))
    seq = [families.prompts(1, seed=1, lo=20, hi=21)[0]]
    out = []
    for p in (models["t"], str(d)):
        m, _ = load_models(ModelPaths(p, None), TargetConfig.from_dir(p), None, torch.float32, "cpu")
        out.append(teacher_forward(m, seq)[1])
    assert not torch.allclose(out[0], out[1], atol=1e-3)


def test_dflash_equals_ar(models):
    ps = families.prompts(10, seed=3)
    assert families.assert_lossless(models["t"], models["d"], ps) > 0


def test_batched_dflash_equals_ar_beyond_the_window(models):
    ps = families.prompts(8, seed=5, lo=12, hi=60)
    acc = families.assert_lossless(models["t"], models["d"], ps, max_tokens=40, draft_lens=(7, 3),
                                   max_num_tokens=40, max_batch_size=3)
    assert acc > 0


def mxfp4_pack(w: torch.Tensor, g: torch.Generator):
    """Random MXFP4 tensors with the shape of a fused [E, in, out] weight: (blocks, scales)."""
    e, n_in, n_out = w.shape
    blocks = torch.randint(0, 256, (e, n_out, n_in // 32, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(120, 130, (e, n_out, n_in // 32), generator=g, dtype=torch.uint8)
    return blocks, scales


def test_mxfp4_experts_dequantise_like_transformers(models, tmp_path):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from dflash_trt.models.gpt_oss import dequantize_mxfp4

    g = torch.Generator().manual_seed(0)
    src = load_file(os.path.join(models["t"], "model.safetensors"))
    packed, dense = dict(src), dict(src)
    for k, v in src.items():
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            b, s = mxfp4_pack(v, g)
            ref = convert_moe_packed_tensors(b, s, dtype=torch.float32)
            assert torch.equal(dequantize_mxfp4(b, s), ref)
            del packed[k]
            packed[k + "_blocks"], packed[k + "_scales"] = b, s
            dense[k] = ref
    # the MXFP4 checkpoint and the same weights in float run identically through the engine
    for name, w in (("mx", packed), ("dense", dense)):
        shutil.copytree(models["t"], tmp_path / name)
        save_file(w, str(tmp_path / name / "model.safetensors"))
    tiny.edit_json(str(tmp_path / "mx" / "config.json"), quantization_config={"quant_method": "mxfp4"})
    from dflash_trt import LLM, SamplingParams
    ps = families.prompts(3, seed=4)
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    a = LLM(target=str(tmp_path / "mx"), speculative=False).generate(ps, sp)
    b = LLM(target=str(tmp_path / "dense"), speculative=False).generate(ps, sp)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    # dflash-build keeps the release's MXFP4 experts (TensorRT-LLM runs them natively) and refuses to requantize
    from dflash_trt.builder.cli import main as build

    eng = tmp_path / "engine"
    assert build(["--target", str(tmp_path / "mx"), "--draft", models["d"], "--output", str(eng), "--quiet"]) == 0
    assert families.target_tensor(str(eng), "model.layers.0.mlp.experts.down_proj_blocks").dtype == torch.uint8
    # the copy is bf16 outside the experts (MXFP4 values are exact in bf16): compare both in bf16
    c = LLM(model=str(eng), speculative=False, dtype="bfloat16").generate(ps, sp)
    a16 = LLM(target=str(tmp_path / "mx"), speculative=False, dtype="bfloat16").generate(ps, sp)
    assert [o.token_ids for o in c] == [o.token_ids for o in a16]
    assert build(["--target", str(tmp_path / "mx"), "--draft", models["d"], "--output", str(tmp_path / "e2"),
                  "--quiet", "--quantization", "fp8"]) == 2


def test_missing_sinks_fail_clearly(models, tmp_path):
    from dflash_trt import LLM

    d = tmp_path / "nosinks"
    shutil.copytree(models["t"], d)
    w = load_file(str(d / "model.safetensors"))
    del w["model.layers.2.self_attn.sinks"]
    save_file(w, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"no attention sinks for layers \[2\]") as e:
        LLM(target=str(d), speculative=False)
    assert "\n" not in str(e.value)


def _mxfp4(w):
    """w with its fused experts as the MXFP4 release stores them (random blocks / scales)."""
    g = torch.Generator().manual_seed(0)
    out = dict(w)
    for k, v in w.items():
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            del out[k]
            out[k + "_blocks"], out[k + "_scales"] = mxfp4_pack(v, g)
    return out


E = "model.layers.1.mlp.experts."


def edited_target(models, tmp_path, edit):
    """A copy of the test target whose weights `edit` changed in place (MXFP4 tensors: config says so)."""
    d = tmp_path / "bad"
    shutil.copytree(models["t"], d)
    w = load_file(str(d / "model.safetensors"))
    edit(w)
    save_file({k: v.contiguous() for k, v in w.items()}, str(d / "model.safetensors"))
    if any(k.endswith("_blocks") for k in w):
        tiny.edit_json(str(d / "config.json"), quantization_config={"quant_method": "mxfp4"})
    return d


@pytest.mark.parametrize("edit,msg", [
    (lambda w: w.pop(E + "gate_up_proj_bias"), r"experts\.gate_up_proj has no model\.layers\.1\.\S+_proj_bias"),
    (lambda w: w.update({E + "down_proj": w[E + "down_proj"][0]}), r"unsupported MoE layout: .*down_proj has shape"),
    (lambda w: w.pop(E + "down_proj"), r"lacks model\.layers\.1\.mlp\.experts\.down_proj \("),
    (lambda w: w.pop(E + "gate_up_proj"), r"lacks model\.layers\.1\.mlp\.experts\.gate_up_proj \("),
    (lambda w: w.update(_mxfp4(w)) or w.pop(E + "down_proj_scales"), r"down_proj_blocks has no .*down_proj_scales"),
    (lambda w: w.update(_mxfp4(w)) or w.update({E + "gate_up_proj_scales": w[E + "gate_up_proj_scales"][..., :-1]}),
     r"unsupported MXFP4 expert tensors"),
], ids=["no_bias", "2d_fused", "no_down_proj", "no_gate_up_proj", "blocks_without_scales", "mxfp4_shape"])
def test_bad_expert_weights_fail_clearly(models, tmp_path, edit, msg):
    """Weight-level layout errors name the tensor the user's checkpoint has (or lacks), on one line."""
    from dflash_trt import LLM

    d = edited_target(models, tmp_path, edit)
    with pytest.raises(CheckpointError, match=msg) as e:
        LLM(target=str(d), speculative=False)
    assert "\n" not in str(e.value)


def _without(*names, mxfp4=False):
    """An edit of the state dict: (the MXFP4 release's layout, then) drop names."""
    def edit(w):
        if mxfp4:
            m = _mxfp4(w)
            w.clear()
            w.update(m)
        for n in names:
            del w[n]
    return edit


@pytest.mark.parametrize("edit,missing", [
    (_without(E + "down_proj"), E + "down_proj"),
    (_without(E + "gate_up_proj"), E + "gate_up_proj"),
    (_without(E + "down_proj_bias"), E + "down_proj_bias"),
    (_without(E + "down_proj_scales", mxfp4=True), E + "down_proj_scales"),
    (_without(E + "gate_up_proj_blocks", E + "gate_up_proj_scales", mxfp4=True), E + "gate_up_proj_blocks"),
], ids=["no_down_proj", "no_gate_up_proj", "no_bias", "mxfp4_no_scales", "mxfp4_no_gate_up_proj"])
def test_build_refuses_a_missing_fused_expert_tensor(models, tmp_path, capsys, edit, missing):
    """dflash-build checks every MoE layer's fused expert tensors from the safetensors headers (a bf16 build never
    loads the target): one line naming the tensor as this checkpoint spells it, exit 2, no output directory."""
    from dflash_trt.builder.cli import main as build

    d = edited_target(models, tmp_path, edit)
    out = tmp_path / "e"
    rc = build(["--target", str(d), "--draft", models["d"], "--output", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and f"weights lack {missing} (" in err and err.count("\n") == 1, err
    assert not out.exists()


def test_release_drafter_saying_model_type_gpt_oss(models, tmp_path, capsys):
    """The release's drafter config says model_type "gpt_oss": dflash-build accepts it and ships it as released,
    with ONE warning line (TensorRT-LLM picks the drafter decoder by model_type and would build GptOssForCausalLM);
    the engine runs it as the Qwen3-style drafter it is (DFlash == AR, drafts accepted). The same drafter saying
    qwen3 builds without a word."""
    from dflash_trt.builder.cli import main as build

    d = gpt_oss_release_drafter(str(tmp_path / "d"), models["t"])
    validate_pair(TargetConfig.from_dir(models["t"]), DraftConfig.from_dir(d), max_draft_len=7)
    e = tmp_path / "e"
    assert build(["--target", models["t"], "--draft", d, "--output", str(e), "--quiet", "--max-seq-len", "512"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: --draft model_type 'gpt_oss'") and err.count("\n") == 1, err
    assert "would build GptOssForCausalLM" in err and '"model_type": "qwen3"' in err
    with open(e / "draft" / "config.json") as f:
        assert json.load(f)["model_type"] == "gpt_oss"  # shipped as released
    assert families.assert_lossless(str(e), None, families.prompts(3, seed=5), max_tokens=12, draft_lens=(7,)) > 0
    q = tmp_path / "q"
    shutil.copytree(d, q)
    tiny.edit_json(str(q / "config.json"), model_type="qwen3")
    assert build(["--target", models["t"], "--draft", str(q), "--output", str(tmp_path / "e2"), "--quiet",
                  "--max-seq-len", "512"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("change,msg", [
    (dict(num_experts_per_tok=5), "unsupported gpt_oss MoE layout"),
    (dict(layer_types=["sliding_attention"] * 3), "config.json is invalid for gpt_oss: .*layer_types"),
    (dict(sliding_window=0), "positive sliding_window"),
    (dict(quantization_config={"quant_method": "gptq"}), "unsupported gpt_oss quantization"),
])
def test_bad_configs_fail_clearly(models, tmp_path, change, msg):
    d = tmp_path / "bad"
    shutil.copytree(models["t"], d)
    tiny.edit_json(str(d / "config.json"), **change)
    with pytest.raises(CheckpointError, match=msg) as e:
        TargetConfig.from_dir(str(d))
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def engines(models, tmp_path_factory):
    from dflash_trt.builder.cli import main as build

    root = tmp_path_factory.mktemp("gpt_oss_engines")
    out = {}
    for name, flags in {"bf16": [], "fp8": ["--quantization", "fp8"]}.items():
        if name == "fp8":
            pytest.importorskip("modelopt")
        out[name] = str(root / name)
        assert build(["--target", models["t"], "--draft", models["d"], "--output", out[name], "--quiet",
                      "--max-seq-len", "512"] + flags) == 0
    return out


@pytest.mark.parametrize("name", ["bf16", "fp8"])
def test_engines_build_and_run_losslessly(models, engines, name):
    from safetensors import safe_open

    e = engines[name]
    with open(os.path.join(e, "engine.json")) as f:
        rec = json.load(f)
    got = (rec["model_type"], rec["block_size"], rec["max_draft_len"], rec["sliding_window"])
    assert got == ("gpt_oss", 8, 7, WINDOW)
    d = DraftConfig.from_dir(models["d"])
    assert (rec["mask_token_id"], rec["target_layer_ids"]) == (d.mask_token_id, d.target_layer_ids)
    shipped = DraftConfig.from_dir(os.path.join(e, "draft"))  # the drafter ships with the release's conventions
    assert (shipped.rope, shipped.attention_bias, shipped.block_size) == (d.rope, True, 8)
    with safe_open(os.path.join(e, "target", "model.safetensors"), "pt") as h:
        experts = h.get_tensor("model.layers.1.mlp.experts.gate_up_proj")
        sinks = h.get_tensor("model.layers.1.self_attn.sinks")
    assert experts.dtype == (torch.float8_e4m3fn if name == "fp8" else torch.bfloat16)  # ModelOpt covers experts
    assert sinks.dtype == torch.bfloat16  # never quantized
    with open(os.path.join(e, "trtllm", "dflash.yaml")) as f:
        assert "moe_expert_parallel_size: 1" in f.read()
    if name == "fp8":
        check_fp8_experts(models["t"], e)
    ps = families.prompts(4, seed=2, lo=10, hi=30)
    families.assert_lossless(e, None, ps, max_tokens=16, draft_lens=(7,), dtype="bfloat16", tp_size=1)


def check_fp8_experts(src_dir, engine):
    """ModelOpt quantizes the fused expert tensors with `<name>_weight_scale`: weight x scale is the source
    within fp8's precision, and the runtime's per-expert weights are exactly that dequantised tensor, split
    (transposed, gate/up interleaved by column)."""
    from dflash_trt.loader import ModelPaths, load_models

    src = load_file(os.path.join(src_dir, "model.safetensors"))
    tgt = os.path.join(engine, "target")
    params = dict(load_models(ModelPaths(tgt, None), TargetConfig.from_dir(tgt), None, torch.float32,
                              "cpu")[0].named_parameters())
    for layer in (0, 3):
        p = f"model.layers.{layer}.mlp.experts."
        for kind in ("gate_up_proj", "down_proj"):
            w8 = families.target_tensor(engine, p + kind)
            scale = families.target_tensor(engine, p + kind + "_weight_scale").float()
            assert w8.dtype == torch.float8_e4m3fn and scale.numel() in (1, w8.shape[0])
            deq = w8.float() * (scale.reshape(-1, 1, 1) if scale.numel() > 1 else scale)
            ref = src[p + kind].float()
            assert (deq - ref).abs().max() <= ref.abs().max() / 16, (layer, kind)
            for x in range(w8.shape[0]):
                w = deq[x].T
                split = {"down_proj": w} if kind == "down_proj" else {"gate_proj": w[0::2], "up_proj": w[1::2]}
                for proj, want in split.items():
                    assert torch.equal(params[f"{p}{x}.{proj}.weight"], want), (layer, x, proj)


def test_tensor_parallel_is_refused(models):
    families.assert_tp_refused(models["t"], "gpt_oss")
