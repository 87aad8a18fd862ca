"""The LLM-API fields of the pinned TensorRT-LLM release that dflash.yaml may use, as data, and a checker.

tensorrt_llm cannot be imported on the project's CPU machines (llm_args.py loads the compiled bindings at module
top), so its pydantic models cannot validate our YAML here. These tables are facts read from the published API
reference of TensorRT-LLM 1.4.0rc1 (nvidia.github.io/TensorRT-LLM/1.4.0rc1/llm-api/reference/):
DFlashDecodingConfig in full (its own fields and those of DecodingBaseConfig), and the fields of the other
sections dflash.yaml writes (TorchLlmArgs, KvCacheConfig, CudaGraphConfig). Every section is a pydantic model
with extra="forbid" upstream, so an unknown key makes trtllm-serve refuse the file at start-up: the builder checks
every generated YAML against these tables before writing it, and tests check the files on disk.

When moving to another release, re-read that release's reference, update the tables and TRTLLM_VERSION together.
"""
from __future__ import annotations

from dataclasses import dataclass

TRTLLM_VERSION = "1.4.0rc1"


@dataclass(frozen=True)
class F:
    """One field: its kind, the values it allows, its bounds, whether null is allowed."""
    kind: str  # int, float, bool, str, path, int_list, int_map, section
    choices: tuple = ()
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    nullable: bool = True
    section: str | None = None  # kind "section": the table that describes the nested mapping


# DFlashDecodingConfig(DecodingBaseConfig), 1.4.0rc1: every field of the signature. moe_backend,
# spec_dec_variant, context_recompute_tail and skip_ctx_buffer_budget_check are new since 1.3.0rc27;
# attention_backend: VANILLA (portable), FA4 (Hopper SM90), TRTLLM (trtllm-gen kernels, Blackwell SM100/SM103).
DFLASH_DECODING_CONFIG = {
    "decoding_type": F("str", choices=("DFlash",), nullable=False),
    "max_draft_len": F("int", ge=0),
    "max_total_draft_tokens": F("int"),
    "speculative_model": F("path"),
    "speculative_model_dir": F("path"),  # the alias trtllm-serve YAML files also use
    "moe_backend": F("str", choices=("AUTO", "CUTLASS", "CUTEDSL", "CUTEDSL_FC12", "TRTLLM", "DEEPGEMM",
                                     "DENSEGEMM", "VANILLA", "TRITON", "MARLIN", "MEGAMOE_DEEPGEMM",
                                     "MEGAMOE_CUTEDSL")),
    "max_concurrency": F("int", gt=0),
    "draft_len_schedule": F("int_map"),
    "load_format": F("str"),
    "acceptance_rate_window_size": F("int", ge=0),
    "acceptance_rate_threshold": F("float", ge=0.0, le=1.0),
    "use_rejection_sampling": F("bool", nullable=False),
    "allow_advanced_sampling": F("bool", nullable=False),
    "advanced_sampling_mode": F("str"),
    "enable_penalty": F("bool", nullable=False),
    "spec_dec_variant": F("int", gt=0),
    "mask_token_id": F("int"),
    "target_layer_ids": F("int_list"),
    "context_recompute_tail": F("int"),
    "attention_backend": F("str", choices=("VANILLA", "TRTLLM", "FA4"), nullable=False),
    "skip_ctx_buffer_budget_check": F("bool", nullable=False),
}

# KvCacheConfig: the fields listed identically by the 1.3.0rc27 and the 1.4.0rc4 references (so in 1.4.0rc1).
KV_CACHE_CONFIG = {
    "enable_block_reuse": F("bool", nullable=False),
    "max_tokens": F("int"),
    "max_attention_window": F("int_list"),
    "sink_token_length": F("int"),
    "free_gpu_memory_fraction": F("float", ge=0.0, le=1.0),
    "host_cache_size": F("int"),
    "disk_cache_size": F("int", ge=0),
    "disk_cache_path": F("path"),
    "cross_kv_cache_fraction": F("float"),
    "secondary_offload_min_priority": F("int"),
    "event_buffer_max_size": F("int", nullable=False),
    "attention_dp_events_gather_period_ms": F("int", nullable=False),
    "enable_partial_reuse": F("bool", nullable=False),
    "copy_on_partial_reuse": F("bool", nullable=False),
    "use_uvm": F("bool", nullable=False),
    "max_gpu_total_bytes": F("int", ge=0, nullable=False),
    "iteration_stats_interval": F("int", gt=0, nullable=False),
    # a free string upstream; these are the KV cache types the pinned release quantizes to
    "dtype": F("str", choices=("auto", "fp8", "nvfp4"), nullable=False),
    "tokens_per_block": F("int", nullable=False),
    # PyTorch backend only: the dtype of hybrid targets' recurrent (Mamba / Gated DeltaNet) state, read from
    # tensorrt_llm/llmapi/llm_args.py's KvCacheConfig (Literal auto | float16 | bfloat16 | float32)
    "mamba_ssm_cache_dtype": F("str", choices=("auto", "float16", "bfloat16", "float32"), nullable=False),
}

# the CUDA graph config of TorchLlmArgs (BaseCudaGraphConfig's fields)
CUDA_GRAPH_CONFIG = {
    "batch_sizes": F("int_list"),
    "max_batch_size": F("int", ge=0, nullable=False),
    "enable_padding": F("bool", nullable=False),
}

# TorchLlmArgs: the fields an LLM-API YAML for DFlash sets. attn_backend is a string upstream, resolved by
# get_attention_backend to one of these four.
LLM_ARGS = {
    "speculative_config": F("section", section="speculative_config"),
    "kv_cache_config": F("section", section="kv_cache_config"),
    "cuda_graph_config": F("section", section="cuda_graph_config"),
    "max_seq_len": F("int", gt=0),
    "max_batch_size": F("int", gt=0),
    "max_num_tokens": F("int", gt=0),
    "max_beam_width": F("int", gt=0),
    "attn_backend": F("str", choices=("TRTLLM", "VANILLA", "FLASHINFER", "FLASHINFER_STAR_ATTENTION"),
                      nullable=False),
    "enable_chunked_prefill": F("bool", nullable=False),
    "disable_overlap_scheduler": F("bool", nullable=False),
    "tensor_parallel_size": F("int", gt=0, nullable=False),
    "pipeline_parallel_size": F("int", gt=0, nullable=False),
    "moe_expert_parallel_size": F("int", gt=0),
    "moe_tensor_parallel_size": F("int", gt=0),
    "enable_attention_dp": F("bool", nullable=False),
    "trust_remote_code": F("bool", nullable=False),
    "dtype": F("str", nullable=False),
}

SECTIONS = {"llm_args": LLM_ARGS, "speculative_config": DFLASH_DECODING_CONFIG,
            "kv_cache_config": KV_CACHE_CONFIG, "cuda_graph_config": CUDA_GRAPH_CONFIG}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _value_problem(f: F, v) -> str | None:
    if v is None:
        return None if f.nullable else "may not be null"
    ok = {"int": _is_int(v), "float": _is_int(v) or isinstance(v, float), "bool": isinstance(v, bool),
          "str": isinstance(v, str), "path": isinstance(v, str) and v != "",
          "int_list": isinstance(v, list) and all(_is_int(x) for x in v),
          "int_map": isinstance(v, dict) and all(_is_int(k) and _is_int(x) for k, x in v.items()),
          "section": isinstance(v, dict)}[f.kind]
    if not ok:
        return f"is {v!r}, not a{'n' if f.kind[0] in 'ai' else ''} {f.kind.replace('_', ' ')}"
    if f.choices and v not in f.choices:
        return f"is {v!r}, not one of {', '.join(map(str, f.choices))}"
    if f.ge is not None and v < f.ge:
        return f"is {v!r}, below its minimum {f.ge}"
    if f.gt is not None and v <= f.gt:
        return f"is {v!r}, must be above {f.gt}"
    if f.le is not None and v > f.le:
        return f"is {v!r}, above its maximum {f.le}"
    return None


def problems(options: dict, section: str = "llm_args", prefix: str = "") -> list[str]:
    """Every key of `options` the pinned release does not have, and every value it does not allow ([] if none)."""
    table = SECTIONS[section]
    if not isinstance(options, dict):
        return [f"{prefix or section} is not a mapping"]
    out = []
    for key, value in options.items():
        name = f"{prefix}{key}"
        f = table.get(key)
        if f is None:
            out.append(f"{name} is not a field of TensorRT-LLM {TRTLLM_VERSION}'s {section}")
            continue
        why = _value_problem(f, value)
        if why is not None:
            out.append(f"{name} {why}")
        elif f.kind == "section":
            out += problems(value, f.section, f"{name}.")
    if section == "speculative_config" and options.get("decoding_type") != "DFlash":
        out.append(f"{prefix}decoding_type must be DFlash")
    return out
