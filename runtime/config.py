"""Model configurations read from Hugging Face / z-lab config.json files, and target/drafter pair validation.

transformers parses the target config (it normalises rope_theta/rope_scaling into rope_parameters); our own
dataclasses keep only what the decode path needs, so the model code never touches a transformers object.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from .errors import CheckpointError, PairError

SUPPORTED_TARGETS = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


@dataclass
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"  # default | linear | llama3 | yarn
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
        if rope_type not in ("default", "linear", "llama3", "yarn"):
            raise CheckpointError(f"unsupported rope_type {rope_type!r}: use default, linear, llama3 or yarn")
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

    @classmethod
    def from_dir(cls, path: str) -> "TargetConfig":
        raw = read_json(os.path.join(path, "config.json"), what="target")
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_TARGETS:
            raise CheckpointError(
                f"{path}: unsupported target model_type {model_type!r}; supported: {', '.join(SUPPORTED_TARGETS)}")
        from transformers import AutoConfig  # configs only: normalises rope fields across versions

        hf = AutoConfig.from_pretrained(path)
        return cls.from_hf(hf)

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
        return cls(
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
            qk_norm=hf.model_type == "qwen3",
            attention_bias=bool(getattr(hf, "attention_bias", False)),
            mlp_bias=bool(getattr(hf, "mlp_bias", False)),
            bos_token_id=getattr(hf, "bos_token_id", None),
            eos_token_ids=eos,
            torch_dtype=str(dtype).replace("torch.", ""),
        )


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
