"""Gemma 4 targets, built from transformers' own Gemma4 classes: a dense text model with per-layer input
embeddings, shared-KV layers (no cache of their own) and double-wide MLPs; a MoE one with K=V full-attention
layers inside the multimodal wrapper (Gemma4ForConditionalGeneration, a vision tower, media placeholder ids),
served text-only. Logits (prefill and decode) and captured features vs transformers, DFlash == AR with a Gemma 4
drafter layout (4 sliding + 1 full layer, soft-capping) and with the oracle drafter, under load, bad configs."""
import shutil

import pytest
import torch

import families
import test_families_batching
import test_lossless
import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.attention import AttentionBatch
from dflash_trt.config import DraftConfig, TargetConfig
from dflash_trt.errors import CheckpointError
from dflash_trt.kv_cache import allocate_caches
from dflash_trt.loader import ModelPaths, load_models
from test_batching import Probe, alone_with_drafts, outputs, run_with_arrivals

WINDOW = 8
S, F = "sliding_attention", "full_attention"
# the last 3 layers (S, S, F) reuse the K/V of layers 1 (the last sliding layer before them) and 2
DENSE = dict(layer_types=[S, S, F, S, S, F], num_kv_shared_layers=3, use_double_wide_mlp=True,
             hidden_size_per_layer_input=8, vocab_size_per_layer_input=families.VOCAB, tie_word_embeddings=False)
MOE = dict(layer_types=[S, F, S, F], attention_k_eq_v=True, num_global_key_value_heads=1, enable_moe_block=True,
           num_experts=4, top_k_experts=2, moe_intermediate_size=32, hidden_size_per_layer_input=0)
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
              head_dim=8, patch_size=2, pooling_kernel_size=2, position_embedding_size=16)
MEDIA = dict(image_token_id=250, video_token_id=251, audio_token_id=252, boi_token_id=253, eoi_token_id=254)
# the published Gemma 4 drafters' layout, scaled down: 4 sliding layers and a full one, soft-capped logits
DRAFT_LAYOUT = {"layer_types": [S, S, S, S, F], "sliding_window": WINDOW, "final_logit_softcapping": 30.0}


def text_config(layout: dict, **over):
    kw = dict(vocab_size=families.VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=WINDOW,
              final_logit_softcapping=30.0, max_position_embeddings=2048, initializer_range=0.2,
              rope_parameters={F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
                               S: {"rope_type": "default", "rope_theta": 1e4}},
              bos_token_id=1, eos_token_id=2, pad_token_id=0, num_hidden_layers=len(layout["layer_types"]))
    return {**kw, **layout, **over}


def _randomise(model):
    """transformers initialises layer_scalar, the router scales and per_expert_scale to 1: draw them, so a
    model that ignored them would not match."""
    with torch.no_grad():
        for n, t in list(model.named_buffers()) + list(model.named_parameters()):
            if n.endswith(("layer_scalar", "router.scale", "per_expert_scale")):
                t.uniform_(0.5, 1.5)
    return model


def gemma4_dense(path, seed=0, **over):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(Gemma4TextConfig(**text_config(DENSE, **over)))
    return families.save_hf(_randomise(model), path, norm_noise=0.3)


def gemma4_moe(path, seed=0, **over):
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    torch.manual_seed(seed)
    model = Gemma4ForConditionalGeneration(Gemma4Config(text_config=text_config(MOE, **over), vision_config=VISION,
                                                        **MEDIA))
    return families.save_hf(_randomise(model), path, norm_noise=0.3)


def gemma4_drafter(path, target):
    """A random drafter of the Gemma 4 layout whose block rows stay close to the mask embedding (five layers
    drift further than families.drafter_for's two), which proposes the target's boosted token."""
    view = families.text_view(target, path + ".target_text")
    return tiny.make_drafter(path, view, block_size=16, layers=5, mask_token_id=tiny.mask_proposing(view, 11),
                             residual_scale=0.03, extra=DRAFT_LAYOUT)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4")
    out = {"dense": gemma4_dense(str(root / "dense")), "moe": gemma4_moe(str(root / "moe"))}
    for name in ("dense", "moe"):
        out[name + "_d"] = gemma4_drafter(str(root / (name + "_d")), out[name])
    return out


def test_config_layout(models):
    c = TargetConfig.from_dir(models["dense"])
    assert c.model_type == "gemma4_text" and c.kv_source == [0, 1, 2, 1, 1, 2] and c.cached_layers == [0, 1, 2]
    assert c.cache_layers() == [(2, 16, 16), (2, 16, 16), (2, 32, 32)]  # per-type head dims; shared layers: none
    assert [c.window(i) for i in range(6)] == [WINDOW, WINDOW, None, WINDOW, WINDOW, None]
    assert c.layer_intermediate == [96] * 3 + [192] * 3 and c.ple_dim == 8 and c.final_logit_softcapping == 30.0
    assert c.rope_partial == {F: 0.25, S: 1.0} and (c.rope.theta, c.rope_local.theta) == (1e6, 1e4)
    m = TargetConfig.from_dir(models["moe"])
    assert (m.model_type, m.weight_prefix, m.attention_k_eq_v) == ("gemma4", "model.language_model.", True)
    assert m.cache_layers() == [(2, 16, 16), (1, 32, 32)] * 2 and m.media_token_ids == [250, 251, 252]
    assert (m.moe.num_experts, m.moe.top_k, m.moe.intermediate_size, m.ple_dim) == (4, 2, 32, 0)


# fp32 both sides; the bound is relative to the largest reference logit (soft-capping keeps it below 30). What
# remains is summation order (measured ~1e-6): a wrong norm, scale, RoPE fraction or cache source is >1e-2.
TOL = 1e-4


@pytest.mark.parametrize("invariant", [True, False], ids=["cpu_kernels", "pytorch"])
@pytest.mark.parametrize("name", ["dense", "moe"])
def test_prefill_logits_match_transformers(models, name, invariant):
    # 1-, 7- and 150-token rows: the 150-token one runs far past the window (random ids hit the media ids too)
    assert families.max_rel_logit_error(models[name], invariant=invariant) < TOL


def decode_logit_error(tdir: str, lengths=(26, 17), prefill=5, page=4, invariant=True) -> float:
    """Our decode steps (every sequence one row per step, batched, over the paged cache) vs transformers'
    logits of the whole sequences, max |diff| / max |ref|."""
    from dflash_trt import ops

    tcfg = TargetConfig.from_dir(tdir)
    target, _ = load_models(ModelPaths(tdir, None), tcfg, None, torch.float32, "cpu")
    hf = families.hf_model(tdir)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, tcfg.vocab_size, (n,), generator=g).tolist() for n in lengths]
    tables, first = [], 0
    for s in seqs:
        tables.append(list(range(first, first + -(-len(s) // page))))
        first += len(tables[-1])
    caches = allocate_caches(first, page, tcfg.cache_layers(), torch.float32, "cpu")
    was = ops.invariant_enabled()
    ops.enable_invariant(invariant)
    worst = 0.0
    try:
        with torch.inference_mode():
            refs = [hf(torch.tensor([s])).logits[0].float() for s in seqs]
            done = 0
            while any(done < len(s) for s in seqs):
                live = [i for i, s in enumerate(seqs) if done < len(s)]
                n = prefill if done == 0 else 1
                meta = [(n, done + n, tables[i]) for i in live]
                ids = torch.tensor([t for i in live for t in seqs[i][done:done + n]])
                pos = torch.tensor([p for _ in live for p in range(done, done + n)])
                hidden, _ = target(ids, pos, caches, AttentionBatch.build(meta, page, "cpu"))
                logits = target.logits(hidden).view(len(live), n, -1)[:, -1]
                for row, i in enumerate(live):
                    ref = refs[i][done + n - 1]
                    worst = max(worst, ((logits[row] - ref).abs().max() / ref.abs().max()).item())
                done += n
    finally:
        ops.enable_invariant(was)
    return worst


@pytest.mark.parametrize("name,invariant", [("dense", True), ("moe", False)], ids=["dense-cpu_kernels", "moe-pytorch"])
def test_decode_logits_match_transformers(models, name, invariant):
    assert decode_logit_error(models[name], invariant=invariant) < TOL


def test_greedy_tokens_match_transformers_generate(models):
    """transformers' own decoding (its sliding-window and shared-KV cache) gives our autoregressive tokens."""
    ps = families.prompts(2, seed=4, lo=5, hi=12)
    ours = LLM(target=models["dense"], speculative=False).generate(ps, SamplingParams(max_tokens=16, ignore_eos=True))
    hf = families.hf_model(models["dense"])
    for p, o in zip(ps, ours):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=16, min_new_tokens=16, do_sample=False)
        assert o.token_ids == ref[0, len(p):].tolist()


@pytest.mark.parametrize("name,ids", [("dense", [0, 1, 3, 4, 5]), ("moe", None)])
def test_captured_features_are_transformers_hidden_states(models, name, ids):
    # dense: shared-KV layers 3 and 4 too; the last layer's capture is its normed output
    assert families.max_rel_capture_error(models[name], capture_ids=ids) < TOL


def test_shared_kv_layers_have_no_cache(models):
    eng = LLM(target=models["dense"], draft=models["dense_d"], draft_len_policy="fixed").engine
    cached = TargetConfig.from_dir(models["dense"]).cache_layers()
    assert eng.kv_plan.target_layers == cached and len(eng.runner.target_caches) == 3
    # the window pool holds the two cached sliding layers, the main pool the full one (plus the drafter's 5)
    assert eng.kv_plan.windowed == [0, 1]
    views = eng.target.layer_caches(eng.runner.target_caches)
    assert [views[i][0] is views[s][0] for i, s in enumerate([0, 1, 2, 1, 1, 2])] == [True] * 6


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_gemma4_drafter_layout_drafts_and_dflash_equals_ar(models, name):
    d = DraftConfig.from_dir(models[name + "_d"])
    assert d.layer_types == [S, S, S, S, F] and d.sliding_window == WINDOW and d.final_logit_softcapping == 30.0
    ps = families.prompts(2, seed=3, lo=10, hi=30)  # prompt + 20 tokens: past the window
    assert families.assert_lossless(models[name], models[name + "_d"], ps, max_tokens=20, draft_lens=(15,)) > 0


def test_every_acceptance_length(models):
    """test_lossless's oracle drafter (the target's own continuation cut at a moving position) on the shared-KV
    target: 8 requests batched, 40 tokens each (five windows), every acceptance length 0..7."""
    test_lossless.test_every_acceptance_length_is_exercised({"llama": (models["dense"], models["dense_d"])}, 7)


def test_lossless_under_load_with_chunking_and_preemption(models):
    """test_families_batching's workload (fewer requests) on the shared-KV target: staggered arrivals, prefill
    chunks beside verify blocks, a main pool small enough to preempt and recompute, windowed layers in their own
    pool; every request's tokens equal those it gets alone."""
    t, d = models["dense"], models["dense_d"]
    reqs = test_families_batching.family_workload(WINDOW, n=6)
    alone, _ = alone_with_drafts(t, d, reqs, page_size=4)
    cfg = dict(max_num_tokens=24, max_batch_size=6, page_size=4, max_seq_len=128)
    llm = LLM(target=t, draft=d, draft_len_policy="fixed", **cfg,
              kv_cache_bytes=test_families_batching.main_block_budget(t, d, 36, **cfg))
    assert llm.engine.blocks.window is not None and llm.engine.blocks.main.num_blocks == 36
    probe = Probe(llm.engine)
    seqs = run_with_arrivals(llm, reqs)
    assert outputs(seqs) == alone
    assert llm.engine.scheduler.num_preemptions > 0, "the small cache was meant to force preemption"
    assert any(i["prefill"] and i["decode"] for i in probe.iters) and sum(s.accepted for s in seqs) > 0


def test_bfloat16_dflash_equals_ar(models):
    ps = families.prompts(3, seed=8, lo=10, hi=30)
    families.assert_lossless(models["dense"], models["dense_d"], ps, max_tokens=12, draft_lens=(7,), dtype="bfloat16")


@pytest.mark.parametrize("change,msg", [
    (dict(use_bidirectional_attention="all"), "use_bidirectional_attention"),
    (dict(hidden_activation="relu"), "hidden_activation"),
    (dict(rope_parameters={F: {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                               "original_max_position_embeddings": 512},
                           S: {"rope_type": "default", "rope_theta": 1e4}}), "full_attention rope_type 'yarn'"),
    (dict(vocab_size_per_layer_input=100), "vocab_size_per_layer_input 100"),
])
def test_bad_configs_fail_clearly(models, tmp_path, change, msg):
    d = tmp_path / "bad"
    shutil.copytree(models["dense"], d)
    tiny.edit_json(str(d / "config.json"), **change)
    with pytest.raises(CheckpointError, match=msg) as e:
        TargetConfig.from_dir(str(d))
    assert "\n" not in str(e.value)


def test_tensor_parallel_is_refused(models):
    families.assert_tp_refused(models["dense"], "gemma4_text")
