"""What each target family adds to TargetConfig, read from its transformers config: MoE layouts, sliding-window
and sink patterns, MLA, partial rotary, wrapper configs. One reader a family, each refusing what it cannot run
in one line."""
from __future__ import annotations

import math

from .errors import CheckpointError
from .config import TargetConfig, MoeConfig, MlaConfig, RopeConfig


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
