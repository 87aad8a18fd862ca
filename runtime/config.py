"""Model configurations read from Hugging Face / z-lab config.json files, and target/drafter pair validation.

transformers parses the target config (it normalises rope_theta/rope_scaling into rope_parameters); our own
dataclasses keep only what the decode path needs, so the model code never touches a transformers object.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from .errors import CheckpointError, PairError

SUPPORTED_TARGETS = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                     "qwen3_moe": "Qwen3MoeForCausalLM", "gpt_oss": "GptOssForCausalLM",
                     "gemma3_text": "Gemma3ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
                     "kimi_k2": "DeepseekV3ForCausalLM",  # Kimi K2: the DeepSeek-V3 architecture, its own model_type
                     # Kimi K2.5 / K2.6: a vision wrapper around DeepSeek-V3, served text-only
                     "kimi_k25": "Kimi_K25ForConditionalGeneration", "minimax_m2": "MiniMaxM2ForCausalLM",
                     # hybrid Gated DeltaNet / full-attention targets (models/qwen3_5.py); the multimodal
                     # Qwen3.5 wrappers are served text-only
                     "qwen3_5": "Qwen3_5ForConditionalGeneration", "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
                     "qwen3_5_text": "Qwen3_5ForCausalLM", "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
                     "qwen3_next": "Qwen3NextForCausalLM",
                     # Gemma 4: text models, and the multimodal wrapper served text-only (family_configs.gemma4)
                     "gemma4_text": "Gemma4ForCausalLM", "gemma4": "Gemma4ForConditionalGeneration"}
HYBRID_TARGETS = ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"  # default | linear | llama3 | yarn | deepseek_yarn
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    @classmethod
    def from_hf(cls, params: dict | None, default_theta: float = 10000.0, max_pos: int = 8192) -> "RopeConfig":
        p = dict(params or {})
        rope_type = p.get("rope_type", p.get("type", "default")) or "default"
        if rope_type not in ("default", "linear", "llama3", "yarn", "deepseek_yarn"):
            raise CheckpointError(f"unsupported rope_type {rope_type!r}: use default, linear, llama3, yarn or "
                                  "deepseek_yarn")
        return cls(
            theta=float(p.get("rope_theta", default_theta)),
            rope_type=rope_type,
            factor=float(p.get("factor", 1.0) or 1.0),
            low_freq_factor=float(p.get("low_freq_factor", 1.0)),
            high_freq_factor=float(p.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(p.get("original_max_position_embeddings", max_pos) or max_pos),
            beta_fast=float(p.get("beta_fast", 32.0) or 32.0),
            beta_slow=float(p.get("beta_slow", 1.0) or 1.0),
            mscale=p.get("mscale"),
            mscale_all_dim=p.get("mscale_all_dim"),
            attention_factor=p.get("attention_factor"),
            truncate=bool(p.get("truncate", True)),
        )


@dataclass
class MoeConfig:
    """A sparse MLP: a router picks `top_k` of `num_experts` SwiGLU experts per token."""
    num_experts: int
    top_k: int
    intermediate_size: int  # per expert
    # "softmax_topk" (Qwen3-MoE) | "topk_softmax" (gpt-oss) | "sigmoid_group" (DeepSeek-V3) | "sigmoid_bias" (MiniMax-M2)
    router: str
    norm_topk_prob: bool = False
    dense_layers: list[int] = field(default_factory=list)  # layers with a dense MLP instead
    bias: bool = False  # router and expert biases (gpt-oss)
    swiglu_alpha: float | None = None  # gpt-oss clamped SwiGLU
    swiglu_limit: float | None = None
    # DeepSeek-V3: sigmoid scores + e_score_correction_bias pick experts within the top `topk_group` of `n_group`
    # groups; weights are the uncorrected scores (renormalised with norm_topk_prob) x routed_scaling_factor
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    shared_intermediate_size: int = 0  # shared experts (one SwiGLU of moe_intermediate_size x n_shared_experts)


@dataclass
class MlaConfig:
    """DeepSeek-V2/V3 multi-head latent attention. Per position the cache holds the normed kv latent
    (kv_lora_rank) and the shared roped key (qk_rope_head_dim): one 'head' of kv_lora_rank + qk_rope_head_dim."""
    kv_lora_rank: int
    q_lora_rank: int | None  # None: a plain q_proj
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool  # DeepSeek's (x0, x1), (x2, x3), ... rotary pairs

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass
class TargetConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool  # Qwen3 normalises q and k per head
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str = "float32"
    hidden_act: str = "silu"
    layer_types: list[str] | None = None  # per layer: full_attention | sliding_attention
    sliding_window: int | None = None
    moe: MoeConfig | None = None
    rope_local: RopeConfig | None = None  # sliding layers' own RoPE (Gemma 3); None: `rope` everywhere
    attn_scale: float | None = None  # softmax scale when not head_dim ** -0.5 (Gemma 3 query_pre_attn_scalar)
    embed_scale: float = 1.0  # embeddings times this (Gemma: sqrt(hidden_size))
    final_logit_softcapping: float | None = None
    mla: MlaConfig | None = None  # multi-head latent attention (DeepSeek-V3); head_dim is then qk_rope_head_dim
    rotary_dim: int | None = None  # partial RoPE: only the first rotary_dim dims of a head rotate (None: head_dim)
    # multimodal placeholders (Kimi K2.5's image / video token ids): transformers embeds them as token 0 when no
    # media comes with them, so a text-only target does too
    media_token_ids: list[int] = field(default_factory=list)
    # linear-attention hybrids: their HybridConfig (models/qwen3_5.py), which the model code reads; only the
    # full-attention layers have a paged cache, the others a fixed-size state per request
    hybrid: object | None = None

    @property
    def cached_layers(self) -> list[int]:
        """Target layers with a paged KV cache, in order (every layer except a hybrid's linear ones)."""
        if self.hybrid is not None:
            return list(self.hybrid.attention_layers)
        return list(range(self.num_hidden_layers))

    def cache_layers(self, tp: int = 1) -> list[tuple[int, int, int]]:
        """Per layer (kv_heads, k_dim, v_dim) of the paged cache on one of `tp` ranks. v_dim 0: the layer keeps
        its values inside the K cache (MLA: the latent is both the key's first part and the value)."""
        if self.mla is not None:
            return [(1, self.mla.kv_lora_rank + self.mla.qk_rope_head_dim, 0)] * self.num_hidden_layers
        return [(self.num_key_value_heads // tp, self.head_dim, self.head_dim)] * len(self.cached_layers)

    def window(self, layer: int) -> int | None:
        """The layer's sliding window (keys p - window + 1 .. p), None for full attention."""
        if self.layer_types is None or self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window

    @classmethod
    def from_dir(cls, path: str) -> "TargetConfig":
        raw = read_json(os.path.join(path, "config.json"), what="target")
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_TARGETS:
            raise CheckpointError(
                f"{path}: unsupported target model_type {model_type!r}; supported: {', '.join(SUPPORTED_TARGETS)}")
        from transformers import AutoConfig  # configs only: normalises rope fields across versions

        try:
            if model_type == "kimi_k2":  # transformers has no kimi_k2 config (the release ships remote code)
                import transformers
                from transformers import DeepseekV3Config

                level = transformers.logging.get_verbosity()
                transformers.logging.set_verbosity_error()  # "a model of type kimi_k2 ... deepseek_v3" warning
                try:
                    hf = DeepseekV3Config.from_pretrained(path)
                finally:
                    transformers.logging.set_verbosity(level)
                hf.model_type = "deepseek_v3"
            else:
                hf = AutoConfig.from_pretrained(path)
        except Exception as e:  # transformers' own validators (layer_types, rope, ...): one line, no traceback
            first = str(e).strip().splitlines()
            raise CheckpointError(f"{path}/config.json is invalid for {model_type}: "
                                  f"{first[-1].strip() if first else type(e).__name__}") from None
        if model_type == "kimi_k25":
            from .family_configs import kimi_k25
            return kimi_k25(hf)
        if model_type in ("gemma4", "gemma4_text"):
            from .family_configs import gemma4
            return gemma4(hf)
        if model_type in HYBRID_TARGETS:
            return cls.from_hybrid(hf)
        return cls.from_hf(hf)

    @classmethod
    def from_hybrid(cls, hf) -> "TargetConfig":
        """A Qwen3.5 / Qwen3.6 / Qwen3-Next config (or its multimodal wrapper, read through text_config)."""
        from .models.qwen3_5 import HybridConfig

        h = HybridConfig.from_hf(hf)
        return cls(model_type=h.model_type, vocab_size=h.vocab_size, hidden_size=h.hidden_size,
                   intermediate_size=h.intermediate_size, num_hidden_layers=h.num_hidden_layers,
                   num_attention_heads=h.num_attention_heads, num_key_value_heads=h.num_key_value_heads,
                   head_dim=h.head_dim, rms_norm_eps=h.rms_norm_eps, rope=h.rope,
                   max_position_embeddings=h.max_position_embeddings, tie_word_embeddings=h.tie_word_embeddings,
                   qk_norm=True, attention_bias=h.attention_bias, bos_token_id=h.bos_token_id,
                   eos_token_ids=list(h.eos_token_ids), torch_dtype=h.torch_dtype, layer_types=list(h.layer_types),
                   moe=h.moe, rotary_dim=h.rotary_dim, hybrid=h)

    @classmethod
    def from_hf(cls, hf) -> "TargetConfig":
        heads = hf.num_attention_heads
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
        rope_params = getattr(hf, "rope_parameters", None)
        if rope_params is None:  # transformers 4.x
            rope_params = dict(getattr(hf, "rope_scaling", None) or {})
            rope_params["rope_theta"] = getattr(hf, "rope_theta", 10000.0)
        eos = hf.eos_token_id
        eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        dtype = getattr(hf, "dtype", None) or getattr(hf, "torch_dtype", None) or "float32"
        cfg = cls(
            model_type=hf.model_type,
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_hidden_layers=hf.num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=getattr(hf, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            rms_norm_eps=hf.rms_norm_eps,
            rope=RopeConfig.from_hf(rope_params, max_pos=hf.max_position_embeddings),
            max_position_embeddings=hf.max_position_embeddings,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            qk_norm=hf.model_type in ("qwen3", "qwen3_moe"),
            attention_bias=bool(getattr(hf, "attention_bias", False)),
            mlp_bias=bool(getattr(hf, "mlp_bias", False)),
            bos_token_id=getattr(hf, "bos_token_id", None),
            eos_token_ids=eos,
            torch_dtype=str(dtype).replace("torch.", ""),
            hidden_act=getattr(hf, "hidden_act", None) or getattr(hf, "hidden_activation", None) or "silu",
        )
        from .family_configs import FAMILIES
        family = FAMILIES.get(hf.model_type)
        if family is not None:
            family(cfg, hf)
        cfg._check_layer_types()
        return cfg

    def _check_layer_types(self) -> None:
        if self.layer_types is None:
            return
        n = self.num_hidden_layers
        if len(self.layer_types) != n or any(t not in LAYER_TYPES for t in self.layer_types):
            raise CheckpointError(f"{self.model_type}: layer_types must list {n} entries among {', '.join(LAYER_TYPES)}, "
                                  f"got {self.layer_types}")
        if "sliding_attention" in self.layer_types and not (self.sliding_window and self.sliding_window > 0):
            raise CheckpointError(f"{self.model_type}: sliding_attention layers need a positive sliding_window, "
                                  f"got {self.sliding_window!r}")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The z-lab rule: one layer -> the middle; else spread from layer 1 to L-3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    block_size: int
    mask_token_id: int | None
    target_layer_ids: list[int]
    num_target_layers: int | None
    vocab_size: int | None = None
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    attention_bias: bool = False
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dir(cls, path: str, num_target_layers: int | None = None) -> "DraftConfig":
        raw = read_json(os.path.join(path, "config.json"), what="drafter")
        return cls.from_dict(raw, num_target_layers=num_target_layers, where=path)

    @classmethod
    def from_dict(cls, raw: dict, num_target_layers: int | None = None, where: str = "drafter") -> "DraftConfig":
        if "speculators_model_type" in raw:
            return cls._from_speculators(raw, num_target_layers, where)
        dcfg = raw.get("dflash_config") or {}

        def pick(name, default=None):  # dflash_config wins over the top level, as in the reference
            return dcfg.get(name, raw.get(name, default))

        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
                   if k not in raw]
        if missing:
            raise CheckpointError(f"{where}/config.json lacks {', '.join(missing)}: not a DFlash drafter config")
        heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        n_layers = raw["num_hidden_layers"]
        n_target = raw.get("num_target_layers", num_target_layers)
        ids = pick("target_layer_ids")
        if ids is None:
            if n_target is None:
                raise CheckpointError(f"{where}/config.json has neither target_layer_ids nor num_target_layers")
            ids = default_target_layer_ids(n_target, n_layers)
        block_size = pick("block_size")
        if block_size is None:
            raise CheckpointError(f"{where}/config.json has no block_size (top level or dflash_config)")
        rope_params = raw.get("rope_parameters") or dict(raw.get("rope_scaling") or {})
        if "rope_theta" not in rope_params:
            rope_params["rope_theta"] = raw.get("rope_theta", 10000.0)
        mask = pick("mask_token_id")
        softcap = pick("final_logit_softcapping")
        return cls(
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope=RopeConfig.from_hf(rope_params, max_pos=raw.get("max_position_embeddings", 8192)),
            block_size=int(block_size),
            mask_token_id=None if mask is None else int(mask),
            target_layer_ids=[int(i) for i in ids],
            num_target_layers=n_target,
            vocab_size=raw.get("vocab_size"),
            layer_types=raw.get("layer_types"),
            sliding_window=raw.get("sliding_window"),
            input_embedding_scale=float(pick("input_embedding_scale", 1.0)),
            output_multiplier=float(pick("output_multiplier", 1.0)),
            final_logit_softcapping=None if softcap in (None, 0) else float(softcap),
            attention_bias=bool(raw.get("attention_bias", False)),
            raw=raw,
        )

    @classmethod
    def _from_speculators(cls, raw: dict, num_target_layers: int | None, where: str) -> "DraftConfig":
        """vLLM's speculators format (`speculators_model_type: dflash`): the draft layers' config nested in
        `transformer_layer_config`, the block fields at top level, the taps as `aux_hidden_state_layer_ids`.

        Those ids index transformers' hidden_states (0 is the embedding output), so a tap k is the output of
        decoder layer k - 1: z-lab's target_layer_ids are the ids minus one. The speculators converter writes
        z-lab's ids plus one ("z-lab reads hidden_states[layer_id + 1]"), and vLLM's update_dflash maps them back
        with i - 1 (vllm#40727). A pruned draft vocabulary (draft_vocab_size, d2t / t2d) is read by draft_vocab."""
        kind = raw.get("speculators_model_type")
        if kind != "dflash":
            raise CheckpointError(f"{where}/config.json is a speculators {kind!r} checkpoint: only "
                                  "speculators_model_type dflash drafters are supported")
        tl = raw.get("transformer_layer_config")
        if not isinstance(tl, dict):
            raise CheckpointError(f"{where}/config.json (speculators dflash) has no transformer_layer_config object: "
                                  "it holds the draft layers' config")
        for flag, why in (("sample_from_anchor", "drafts from the anchor row too (DSpark-style blocks)"),
                          ("sliding_window_non_causal", "attends bidirectionally inside sliding-window blocks")):
            if raw.get(flag):
                raise CheckpointError(f"unsupported speculators dflash {flag}: true ({why}); DFlash drafters "
                                      "leave it false")
        aux = raw.get("aux_hidden_state_layer_ids")
        if not aux or not all(isinstance(i, int) for i in aux):
            raise CheckpointError(f"{where}/config.json (speculators dflash) has no aux_hidden_state_layer_ids: set "
                                  "the target hidden-state indices the drafter reads (z-lab target_layer_ids + 1)")
        if min(aux) < 1:
            raise CheckpointError(f"speculators dflash aux_hidden_state_layer_ids {aux} include 0, the embedding "
                                  "output: DFlash taps decoder layer outputs (indices 1..num_hidden_layers)")
        hidden = tl.get("hidden_size")
        if raw.get("target_hidden_size") not in (None, hidden):
            raise CheckpointError(f"unsupported speculators dflash target_hidden_size {raw['target_hidden_size']} "
                                  f"!= draft hidden_size {hidden}: the drafter must share the target's width")
        # written with to_diff_dict(): fields at their config class's defaults are absent, so the class fills them
        from transformers import AutoConfig

        try:
            layer_cfg = AutoConfig.for_model(tl.get("model_type", "qwen3"), **{
                k: v for k, v in tl.items() if k != "model_type"}).to_dict()
        except Exception as e:
            first = str(e).strip().splitlines()
            raise CheckpointError(f"{where}/config.json transformer_layer_config is invalid: "
                                  f"{first[-1].strip() if first else type(e).__name__}") from None
        zlab = {**layer_cfg, "block_size": raw.get("block_size", 8),  # speculators' own default
                "dflash_config": {"mask_token_id": raw.get("mask_token_id"),
                                  "target_layer_ids": [i - 1 for i in aux]}}
        zlab.pop("num_target_layers", None)
        cfg = cls.from_dict(zlab, num_target_layers=num_target_layers, where=where)
        cfg.num_target_layers = None  # the format does not record it; validate_pair checks the taps' range
        cfg.raw = raw
        return cfg


def validate_pair(target: TargetConfig, draft: DraftConfig, fc_in_features: int | None = None,
                  max_draft_len: int | None = None) -> None:
    """Every check TensorRT-LLM and our runtime rely on, before any weight is read. Raises PairError."""
    if draft.hidden_size != target.hidden_size:
        raise PairError(f"drafter hidden_size {draft.hidden_size} != target hidden_size {target.hidden_size}: "
                        "this drafter was trained for another target")
    if draft.vocab_size is not None and draft.vocab_size != target.vocab_size:
        raise PairError(f"drafter vocab_size {draft.vocab_size} != target vocab_size {target.vocab_size}: "
                        "the drafter shares the target's embedding and lm_head, so they must match")
    if not draft.target_layer_ids:
        raise PairError("drafter target_layer_ids is empty: give at least one target layer to read features from")
    bad = [i for i in draft.target_layer_ids if not 0 <= i < target.num_hidden_layers]
    if bad:
        raise PairError(f"drafter target_layer_ids {bad} out of range for a target with "
                        f"{target.num_hidden_layers} layers (valid: 0..{target.num_hidden_layers - 1})")
    if draft.num_target_layers is not None and draft.num_target_layers != target.num_hidden_layers:
        raise PairError(f"drafter num_target_layers {draft.num_target_layers} != target num_hidden_layers "
                        f"{target.num_hidden_layers}: this drafter was trained for another target")
    if draft.mask_token_id is None:
        raise PairError("drafter config has no mask_token_id (dflash_config.mask_token_id or top level): set it")
    if not 0 <= draft.mask_token_id < target.vocab_size:
        raise PairError(f"drafter mask_token_id {draft.mask_token_id} out of range for target vocab_size "
                        f"{target.vocab_size}")
    if draft.block_size < 2:
        raise PairError(f"drafter block_size {draft.block_size} must be >= 2 (one bonus row and one draft row)")
    if max_draft_len is not None and not 1 <= max_draft_len <= draft.block_size - 1:
        raise PairError(f"max_draft_len {max_draft_len} must be between 1 and block_size - 1 = "
                        f"{draft.block_size - 1}")
    if draft.num_attention_heads % draft.num_key_value_heads:
        raise PairError(f"drafter num_attention_heads {draft.num_attention_heads} is not a multiple of "
                        f"num_key_value_heads {draft.num_key_value_heads}")
    if draft.head_dim % 2:
        raise PairError(f"drafter head_dim {draft.head_dim} must be even for rotary embeddings")
    expect_fc = target.hidden_size * len(draft.target_layer_ids)
    if fc_in_features is not None and fc_in_features != expect_fc:
        raise PairError(f"drafter fc.weight has {fc_in_features} input features, expected hidden_size x "
                        f"len(target_layer_ids) = {expect_fc}: target_layer_ids do not match the weights")


def read_json(path: str, what: str) -> dict:
    if not os.path.isfile(path):
        raise CheckpointError(f"{what} config not found: {path} (give a Hugging Face checkpoint directory)")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{what} config {path} is unreadable: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} config {path} is not a JSON object")
    return data
