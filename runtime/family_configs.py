"""What each target family adds to TargetConfig, read from its transformers config: MoE layouts, sliding-window
and sink patterns, MLA, partial rotary, wrapper configs. One reader a family, each refusing what it cannot run
in one line."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import CheckpointError
from .config import LAYER_TYPES, TargetConfig, MoeConfig, MlaConfig, RopeConfig


def _moe_counts(model_type: str, n_experts, top_k, inter) -> None:
    if not n_experts or not top_k or not inter or not 1 <= top_k <= n_experts:
        raise CheckpointError(f"unsupported {model_type} MoE layout: num_experts {n_experts}, experts per token "
                              f"{top_k}, expert intermediate size {inter} (need 1 <= experts per token <= num_experts)")


def _qwen3_moe(cfg: TargetConfig, hf) -> None:
    if cfg.hidden_act != "silu":
        raise CheckpointError(f"unsupported qwen3_moe hidden_act {cfg.hidden_act!r}: only silu (SwiGLU) experts")
    step = getattr(hf, "decoder_sparse_step", 1)
    if not isinstance(step, int) or step < 1:
        raise CheckpointError(f"unsupported qwen3_moe decoder_sparse_step {step!r}: must be a positive integer")
    n = getattr(hf, "num_experts", 0) or 0
    only = set(getattr(hf, "mlp_only_layers", None) or [])
    dense = [i for i in range(cfg.num_hidden_layers) if i in only or n == 0 or (i + 1) % step]
    if len(dense) < cfg.num_hidden_layers:
        _moe_counts("qwen3_moe", n, hf.num_experts_per_tok, hf.moe_intermediate_size)
    cfg.moe = MoeConfig(num_experts=n, top_k=hf.num_experts_per_tok, intermediate_size=hf.moe_intermediate_size,
                        router="softmax_topk", norm_topk_prob=bool(hf.norm_topk_prob), dense_layers=dense)
    if getattr(hf, "sliding_window", None):  # transformers keeps it only with use_sliding_window: every layer
        cfg.sliding_window = int(hf.sliding_window)
        cfg.layer_types = ["sliding_attention"] * cfg.num_hidden_layers


def _gpt_oss(cfg: TargetConfig, hf) -> None:
    n, k = getattr(hf, "num_local_experts", 0), getattr(hf, "num_experts_per_tok", 0)
    _moe_counts("gpt_oss", n, k, cfg.intermediate_size)
    cfg.moe = MoeConfig(num_experts=n, top_k=k, intermediate_size=cfg.intermediate_size, router="topk_softmax",
                        bias=True, swiglu_alpha=float(hf.swiglu_alpha), swiglu_limit=float(hf.swiglu_limit))
    cfg.layer_types = list(hf.layer_types)
    cfg.sliding_window = hf.sliding_window
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise CheckpointError(f"gpt_oss num_attention_heads {cfg.num_attention_heads} is not a multiple of "
                              f"num_key_value_heads {cfg.num_key_value_heads}")
    q = getattr(hf, "quantization_config", None) or {}
    q = q if isinstance(q, dict) else q.to_dict()
    if q and q.get("quant_method") not in ("mxfp4", "modelopt"):
        raise CheckpointError(f"unsupported gpt_oss quantization {q.get('quant_method')!r}: give the MXFP4 release "
                              "or a bf16 checkpoint")


def _gemma3_text(cfg: TargetConfig, hf) -> None:
    if getattr(hf, "use_bidirectional_attention", False):
        raise CheckpointError("unsupported gemma3_text use_bidirectional_attention: only causal decoders can "
                              "be speculated on")
    if getattr(hf, "attn_logit_softcapping", None):
        raise CheckpointError("unsupported gemma3_text attn_logit_softcapping: attention-score soft-capping "
                              "(a Gemma 2 feature) is not implemented; Gemma 3 checkpoints leave it null")
    if cfg.hidden_act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise CheckpointError(f"unsupported gemma3_text hidden_activation {cfg.hidden_act!r}: only "
                              "gelu_pytorch_tanh")
    rp = hf.rope_parameters or {}
    if "full_attention" not in rp or "sliding_attention" not in rp:
        raise CheckpointError(f"gemma3_text rope_parameters must hold full_attention and sliding_attention "
                              f"entries, got {sorted(rp)}")
    cfg.rope = RopeConfig.from_hf(rp["full_attention"], max_pos=cfg.max_position_embeddings)
    cfg.rope_local = RopeConfig.from_hf(rp["sliding_attention"], max_pos=cfg.max_position_embeddings)
    cfg.layer_types = list(hf.layer_types)
    cfg.sliding_window = hf.sliding_window
    cfg.qk_norm = True
    cfg.attn_scale = float(hf.query_pre_attn_scalar) ** -0.5
    cfg.embed_scale = cfg.hidden_size ** 0.5
    cap = getattr(hf, "final_logit_softcapping", None)
    cfg.final_logit_softcapping = float(cap) if cap else None


def _deepseek_v3(cfg: TargetConfig, hf) -> None:
    q = getattr(hf, "quantization_config", None) or {}
    q = q if isinstance(q, dict) else q.to_dict()
    if q and q.get("quant_method") != "modelopt":
        raise CheckpointError(f"unsupported deepseek_v3 quantization {q.get('quant_method')!r}: give a bf16 "
                              "checkpoint (the block-FP8 release dequantised) or a dflash-build export")
    if cfg.hidden_act != "silu":
        raise CheckpointError(f"unsupported deepseek_v3 hidden_act {cfg.hidden_act!r}: only silu (SwiGLU) MLPs")
    heads = cfg.num_attention_heads
    if cfg.num_key_value_heads != heads:
        raise CheckpointError(f"unsupported deepseek_v3 attention layout: num_key_value_heads "
                              f"{cfg.num_key_value_heads} != num_attention_heads {heads} (MLA expands the latent "
                              "to every head)")
    qr = hf.q_lora_rank
    dims = dict(kv_lora_rank=hf.kv_lora_rank, qk_nope_head_dim=hf.qk_nope_head_dim,
                qk_rope_head_dim=hf.qk_rope_head_dim, v_head_dim=hf.v_head_dim)
    bad = {k: v for k, v in dims.items() if not isinstance(v, int) or v < 1}
    if bad or (qr is not None and (not isinstance(qr, int) or qr < 1)) or hf.qk_rope_head_dim % 2:
        raise CheckpointError(f"unsupported deepseek_v3 attention layout: q_lora_rank {qr}, "
                              f"{', '.join(f'{k} {v}' for k, v in dims.items())} (need positive sizes, an even "
                              "qk_rope_head_dim, q_lora_rank null or positive)")
    cfg.mla = MlaConfig(q_lora_rank=qr, rope_interleave=bool(getattr(hf, "rope_interleave", True)), **dims)
    cfg.head_dim = hf.qk_rope_head_dim  # the rotary table's width, as transformers sets it
    n, k = hf.n_routed_experts or 0, hf.num_experts_per_tok or 0
    first = hf.first_k_dense_replace or 0
    dense = list(range(min(first, cfg.num_hidden_layers)))
    groups, topk_group = hf.n_group or 1, hf.topk_group or 1
    if len(dense) < cfg.num_hidden_layers:
        _moe_counts("deepseek_v3", n, k, hf.moe_intermediate_size)
        per = n // groups if groups > 0 and n % groups == 0 else 0
        if per < 2 or not 1 <= topk_group <= groups or k > topk_group * per:
            raise CheckpointError(f"unsupported deepseek_v3 MoE layout: {n} routed experts in n_group {groups} "
                                  f"(topk_group {topk_group}, {k} experts per token): need n_group dividing the "
                                  "experts with >= 2 per group, 1 <= topk_group <= n_group and experts per token "
                                  "<= topk_group x experts per group")
        if (hf.n_shared_experts or 0) < 0:
            raise CheckpointError(f"unsupported deepseek_v3 n_shared_experts {hf.n_shared_experts}")
    cfg.moe = MoeConfig(num_experts=n, top_k=k, intermediate_size=hf.moe_intermediate_size, router="sigmoid_group",
                        norm_topk_prob=bool(hf.norm_topk_prob), dense_layers=dense, n_group=groups,
                        topk_group=topk_group, routed_scaling_factor=float(hf.routed_scaling_factor),
                        shared_intermediate_size=hf.moe_intermediate_size * (hf.n_shared_experts or 0))
    cfg.attn_scale = cfg.mla.qk_head_dim ** -0.5
    rp = getattr(hf, "rope_parameters", None) or {}
    if rp.get("rope_type", "default") != "default" and rp.get("mscale_all_dim"):  # transformers' yarn_apply_mscale
        f = float(rp["factor"])
        m = 0.1 * float(rp["mscale_all_dim"]) * math.log(f) + 1.0 if f > 1 else 1.0
        cfg.attn_scale *= m * m


def _quant_method(hf) -> str | None:
    q = getattr(hf, "quantization_config", None) or {}
    q = q if isinstance(q, dict) else q.to_dict()
    return q.get("quant_method") if q else None


def _minimax_m2(cfg: TargetConfig, hf) -> None:
    method = _quant_method(hf)
    if method not in (None, "modelopt"):
        raise CheckpointError(f"unsupported minimax_m2 quantization {method!r}: give a bf16 checkpoint (the "
                              "block-FP8 release dequantised) or a dflash-build export")
    if cfg.hidden_act != "silu":
        raise CheckpointError(f"unsupported minimax_m2 hidden_act {cfg.hidden_act!r}: only silu (SwiGLU) experts")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise CheckpointError(f"minimax_m2 num_attention_heads {cfg.num_attention_heads} is not a multiple of "
                              f"num_key_value_heads {cfg.num_key_value_heads}")
    n, k = getattr(hf, "num_local_experts", 0), getattr(hf, "num_experts_per_tok", 0)
    _moe_counts("minimax_m2", n, k, cfg.intermediate_size)
    # every layer is sparse; intermediate_size is the per-expert width
    cfg.moe = MoeConfig(num_experts=n, top_k=k, intermediate_size=cfg.intermediate_size, router="sigmoid_bias",
                        norm_topk_prob=True)
    # the release's legacy `rotary_dim` reaches transformers as rope_parameters.partial_rotary_factor
    factor = float((getattr(hf, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0) or 1.0)
    rot = int(cfg.head_dim * factor)
    if rot < 2 or rot % 2 or rot > cfg.head_dim:
        raise CheckpointError(f"unsupported minimax_m2 partial rotary: {rot} rotary dims of head_dim {cfg.head_dim} "
                              "(partial_rotary_factor / rotary_dim must give an even number between 2 and head_dim)")
    cfg.rotary_dim = rot


def kimi_k25(hf) -> TargetConfig:
    """Kimi K2.5 / K2.6 (Kimi_K25ForConditionalGeneration): a vision tower and projector around a DeepSeek-V3
    language model (`text_config`; transformers renames the release's kimi_k2 to deepseek_v3). Served text-only:
    the language model's config, with the wrapper's word-embedding tying (transformers ties on the wrapper's
    flag, which defaults to true there)."""
    text = getattr(hf, "text_config", None)
    if text is None or text.model_type != "deepseek_v3":
        raise CheckpointError(f"unsupported kimi_k25 text_config model_type "
                              f"{getattr(text, 'model_type', None)!r}: Kimi K2.5 / K2.6 wrap a DeepSeek-V3 language "
                              "model (deepseek_v3 or kimi_k2)")
    method = _quant_method(hf)
    if method not in (None, "modelopt"):
        raise CheckpointError(f"unsupported kimi_k25 quantization {method!r}: give a bf16 checkpoint (the INT4 "
                              "release dequantised) or a dflash-build export")
    cfg = TargetConfig.from_hf(text)
    cfg.model_type = "kimi_k25"
    cfg.media_token_ids = [int(i) for i in (getattr(hf, "image_token_id", None), getattr(hf, "video_token_id", None))
                           if i is not None]
    cfg.tie_word_embeddings = bool(getattr(hf, "tie_word_embeddings", True))
    if cfg.bos_token_id is None:
        cfg.bos_token_id = getattr(hf, "bos_token_id", None)
    if not cfg.eos_token_ids:
        eos = getattr(hf, "eos_token_id", None)
        cfg.eos_token_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    return cfg


FAMILIES = {"qwen3_moe": _qwen3_moe, "gpt_oss": _gpt_oss, "gemma3_text": _gemma3_text, "deepseek_v3": _deepseek_v3,
             "minimax_m2": _minimax_m2}


# ---- Gemma 4 --------------------------------------------------------------------------------------------------
GEMMA4_ROPE_TYPES = ("default", "linear", "proportional")
# the multimodal wrapper's checkpoints hold the language model here; vision / audio towers are never loaded
GEMMA4_WRAPPER_PREFIX = "model.language_model."


@dataclass
class Gemma4Config(TargetConfig):
    """A Gemma 4 text model (gemma4_text, or the text_config of a gemma4 multimodal wrapper served text-only).

    Sliding and full layers differ in head_dim and kv heads (transformers' per_layer_config), so these are per
    layer. Shared-KV layers (num_kv_shared_layers) have no cache of their own: they read the last earlier layer of
    their type that does ("store"), so only `cached_layers` get a paged cache."""
    layer_head_dims: list[int] = field(default_factory=list)
    layer_kv_heads: list[int] = field(default_factory=list)
    layer_intermediate: list[int] = field(default_factory=list)  # use_double_wide_mlp doubles the shared layers'
    kv_source: list[int] = field(default_factory=list)  # per layer: the layer whose K/V it attends over
    attention_k_eq_v: bool = False  # full layers: values are the keys' projection (no v_proj)
    rope_partial: dict = field(default_factory=dict)  # layer type -> proportional RoPE's rotated fraction
    ple_dim: int = 0  # hidden_size_per_layer_input (0: no per-layer input embeddings)
    ple_vocab: int = 0
    pad_token_id: int = 0
    weight_prefix: str = "model."

    @property
    def cached_layers(self) -> list[int]:
        return [i for i, s in enumerate(self.kv_source) if s == i]

    def cache_layers(self, tp: int = 1) -> list[tuple[int, int, int]]:
        return [(self.layer_kv_heads[i] // tp, self.layer_head_dims[i], self.layer_head_dims[i])
                for i in self.cached_layers]


def _gemma4_rope(model_type: str, rp: dict, kind: str, max_pos: int) -> tuple[RopeConfig, float]:
    p = rp.get(kind)
    if not isinstance(p, dict):
        raise CheckpointError(f"{model_type} rope_parameters must hold a {kind} entry, got {sorted(rp)}")
    rope_type = p.get("rope_type", "default")
    if rope_type not in GEMMA4_ROPE_TYPES:
        raise CheckpointError(f"unsupported {model_type} {kind} rope_type {rope_type!r}: use "
                              f"{', '.join(GEMMA4_ROPE_TYPES)}")
    # linear and default are proportional RoPE rotating every dim: one frequency rule for all three
    partial = float(p.get("partial_rotary_factor", 1.0) if rope_type == "proportional" else 1.0)
    factor = float(p.get("factor", 1.0) or 1.0) if rope_type != "default" else 1.0
    if not 0 < partial <= 1:
        raise CheckpointError(f"unsupported {model_type} {kind} partial_rotary_factor {partial}: must be in (0, 1]")
    return RopeConfig(theta=float(p.get("rope_theta", 10000.0)), rope_type="proportional", factor=factor,
                      original_max_position_embeddings=max_pos), partial


def gemma4(hf) -> Gemma4Config:
    """Gemma4ForCausalLM (gemma4_text) or Gemma4ForConditionalGeneration (gemma4: its text_config, the language
    model's weights under model.language_model.; word-embedding tying and media placeholder ids from the
    wrapper, whose image / video / audio ids transformers embeds as the pad token when no media comes with
    them)."""
    wrapper = getattr(hf, "text_config", None) is not None and hf.model_type == "gemma4"
    t = hf.text_config if wrapper else hf
    name = hf.model_type
    method = _quant_method(hf) or _quant_method(t)
    if method not in (None, "modelopt"):
        raise CheckpointError(f"unsupported {name} quantization {method!r}: give a bf16 checkpoint or a "
                              "dflash-build export")
    if t.use_bidirectional_attention == "all":
        raise CheckpointError(f"unsupported {name} use_bidirectional_attention 'all': only causal decoders can be "
                              "speculated on")
    act = getattr(t, "hidden_activation", None)
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise CheckpointError(f"unsupported {name} hidden_activation {act!r}: only gelu_pytorch_tanh")
    n = t.num_hidden_layers
    try:
        modes = list(t.kv_sharing_modes)
        per = [t.per_layer_config[i] for i in range(n)]
    except (ValueError, KeyError, IndexError) as e:  # transformers' own check of the sharing layout
        raise CheckpointError(f"unsupported {name} num_kv_shared_layers {t.num_kv_shared_layers}: {e}") from None
    types = list(t.layer_types)
    if len(types) != n or any(x not in LAYER_TYPES for x in types):
        raise CheckpointError(f"{name}: layer_types must list {n} entries among {', '.join(LAYER_TYPES)}, "
                              f"got {types}")
    # a reusing layer attends over the K/V of the last earlier layer of its type that stores them
    source = list(range(n))
    for i, m in enumerate(modes):
        if m == "reuse":
            source[i] = max(j for j in range(i) if modes[j] == "store" and types[j] == types[i])
    heads = t.num_attention_heads
    head_dims = [int(p.head_dim) for p in per]
    kv_heads = [int(p.num_key_value_heads) for p in per]
    bad = [i for i in range(n) if kv_heads[i] < 1 or heads % kv_heads[i] or head_dims[i] % 2]
    if bad:
        i = bad[0]
        raise CheckpointError(f"unsupported {name} attention layout in layer {i}: {heads} heads over {kv_heads[i]} "
                              f"kv heads, head_dim {head_dims[i]} (need a divisor and an even head_dim)")
    max_pos = t.max_position_embeddings
    rp = t.rope_parameters or {}
    rope, partial_full = _gemma4_rope(name, rp, "full_attention", max_pos)
    rope_local, partial_local = _gemma4_rope(name, rp, "sliding_attention", max_pos) \
        if "sliding_attention" in types else (rope, partial_full)
    inter = [t.intermediate_size * (2 if t.use_double_wide_mlp and modes[i] == "reuse" else 1) for i in range(n)]
    moe = None
    if t.enable_moe_block:
        _moe_counts(name, t.num_experts, t.top_k_experts, t.moe_intermediate_size)
        moe = MoeConfig(num_experts=t.num_experts, top_k=t.top_k_experts, intermediate_size=t.moe_intermediate_size,
                        router="gemma4", norm_topk_prob=True)
    ple = int(t.hidden_size_per_layer_input or 0)
    if ple and t.vocab_size_per_layer_input < t.vocab_size:
        raise CheckpointError(f"unsupported {name} vocab_size_per_layer_input {t.vocab_size_per_layer_input} < "
                              f"vocab_size {t.vocab_size}: every token needs a per-layer input embedding")
    eos = t.eos_token_id if t.eos_token_id is not None else getattr(hf, "eos_token_id", None)
    eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    dtype = getattr(t, "dtype", None) or getattr(hf, "dtype", None) or "bfloat16"
    cap = t.final_logit_softcapping
    media = [getattr(hf, k, None) for k in ("image_token_id", "video_token_id", "audio_token_id")] if wrapper else []
    cfg = Gemma4Config(
        model_type=name, vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
        # per layer in layer_head_dims / layer_kv_heads (transformers refuses the global attributes): layer 0's here
        num_hidden_layers=n, num_attention_heads=heads, num_key_value_heads=kv_heads[0],
        head_dim=head_dims[0], rms_norm_eps=t.rms_norm_eps, rope=rope, max_position_embeddings=max_pos,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", True)), qk_norm=True,
        attention_bias=bool(t.attention_bias), bos_token_id=t.bos_token_id, eos_token_ids=eos,
        torch_dtype=str(dtype).replace("torch.", ""), hidden_act=act, layer_types=types,
        sliding_window=t.sliding_window, moe=moe, rope_local=rope_local, attn_scale=1.0,
        embed_scale=t.hidden_size ** 0.5, final_logit_softcapping=float(cap) if cap else None,
        media_token_ids=[int(m) for m in media if m is not None],
        layer_head_dims=head_dims, layer_kv_heads=kv_heads, layer_intermediate=inter, kv_source=source,
        attention_k_eq_v=bool(t.attention_k_eq_v),
        rope_partial={"full_attention": partial_full, "sliding_attention": partial_local}, ple_dim=ple,
        ple_vocab=int(t.vocab_size_per_layer_input or 0) if ple else 0,
        pad_token_id=int(t.pad_token_id if t.pad_token_id is not None else 0),
        weight_prefix=GEMMA4_WRAPPER_PREFIX if wrapper else "model.")
    cfg._check_layer_types()
    return cfg
