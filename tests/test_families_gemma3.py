"""Gemma 3 text targets: (1 + w) norms, embedding scale, query_pre_attn_scalar, local/global RoPE, sliding
windows, final logit soft-capping."""
import shutil

import pytest
import torch

import families
import tiny
from dflash_trt.config import TargetConfig
from dflash_trt.errors import CheckpointError

WINDOW = 8
TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]


def gemma3(path, seed=0, **over):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    kw = dict(vocab_size=families.VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16, layer_types=TYPES, sliding_window=WINDOW,
              query_pre_attn_scalar=24, final_logit_softcapping=30.0, max_position_embeddings=2048,
              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
              initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    kw.update(over)
    return families.save_hf(Gemma3ForCausalLM(Gemma3TextConfig(**kw)), path, norm_noise=0.3)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3")
    t = gemma3(str(root / "t"))
    d = families.drafter_for(str(root / "d"), t, block_size=16, extra={
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": WINDOW})
    return {"t": t, "d": d}


def test_config_layout(models):
    c = TargetConfig.from_dir(models["t"])
    assert [c.window(i) for i in range(4)] == [WINDOW, WINDOW, None, WINDOW]
    assert (c.rope.rope_type, c.rope.theta, c.rope_local.theta) == ("linear", 1e6, 1e4)
    assert c.attn_scale == 24 ** -0.5 and c.embed_scale == 8.0 and c.final_logit_softcapping == 30.0


@pytest.mark.parametrize("invariant", [True, False], ids=["cpu_kernels", "pytorch"])
def test_logits_match_transformers(models, invariant):
    # fp32 both sides; the bound is relative to the largest reference logit (soft-capping keeps it below 30).
    # Remaining differences are summation orders (~1e-6 relative).
    assert families.max_rel_logit_error(models["t"], invariant=invariant) < 1e-4


def test_dflash_equals_ar(models):
    ps = families.prompts(10, seed=3)
    assert families.assert_lossless(models["t"], models["d"], ps) > 0


def test_batched_dflash_equals_ar_beyond_the_window(models):
    ps = families.prompts(8, seed=5, lo=12, hi=60)
    acc = families.assert_lossless(models["t"], models["d"], ps, max_tokens=40, draft_lens=(15, 4),
                                   max_num_tokens=40, max_batch_size=3)
    assert acc > 0


def test_bfloat16_dflash_equals_ar(models):
    ps = families.prompts(6, seed=8, lo=10, hi=40)
    families.assert_lossless(models["t"], models["d"], ps, max_tokens=20, draft_lens=(7,), dtype="bfloat16")


@pytest.mark.parametrize("change,msg", [
    (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
    (dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
    (dict(hidden_activation="relu"), "hidden_activation"),
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
    return families.build_engines(models["t"], models["d"], tmp_path_factory.mktemp("gemma3_engines"),
                                  {"bf16": [], "fp8": ["--quantization", "fp8"]})


@pytest.mark.parametrize("name", ["bf16", "fp8"])
def test_engines_build_and_run_losslessly(engines, name):
    import json
    import os

    e = engines[name]
    with open(os.path.join(e, "engine.json")) as f:
        rec = json.load(f)
    assert (rec["model_type"], rec["sliding_window"], rec["moe"]) == ("gemma3_text", WINDOW, None)
    with open(os.path.join(e, "trtllm", "dflash.yaml")) as f:
        assert "moe_expert_parallel_size" not in f.read()  # dense: no MoE settings
    assert rec["ep_size"] is None
    for script in ("serve.sh", "serve_multinode.sh", "bench.sh"):
        with open(os.path.join(e, "trtllm", script)) as f:
            assert "--ep" not in f.read(), script
    w = families.target_tensor(e, "model.layers.2.mlp.gate_proj.weight")
    assert w.dtype == (torch.float8_e4m3fn if name == "fp8" else torch.bfloat16)
    ps = families.prompts(4, seed=2, lo=10, hi=30)
    families.assert_lossless(e, None, ps, max_tokens=16, draft_lens=(7,), dtype="bfloat16", tp_size=1)


def test_ep_size_needs_a_moe_target(models, tmp_path, capsys):
    from dflash_trt.builder.cli import main as build

    assert build(["--target", models["t"], "--draft", models["d"], "--quiet", "--output", str(tmp_path / "e"),
                  "--tp-size", "2", "--ep-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "--ep-size 2 needs a mixture-of-experts target; gemma3_text is dense" in err and err.count("\n") == 1


def test_tensor_parallel_is_refused(models):
    families.assert_tp_refused(models["t"], "gemma3_text")
