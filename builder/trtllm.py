"""The TensorRT-LLM side of an engine directory: the LLM-API YAML and the launch scripts.

Pinned to one TensorRT-LLM release with DFlash on the PyTorch backend (one-model speculative decoding,
`DFlashDecodingConfig`). The fields written here are checked against that release's field list, kept as data in
trtllm_schema.py, before any file is written. Field names drift between release candidates: when moving to
another version, update trtllm_schema.py (which holds TRTLLM_VERSION) from that release's API reference.
"""
from __future__ import annotations

import json
import re
import shlex

from .trtllm_schema import TRTLLM_VERSION, problems

TRTLLM_BACKEND = "pytorch"

# After a KV-cache reuse hit TensorRT-LLM skips the target forward over the reused prompt tokens, so their
# hidden states never reach the drafter, whose context features come only from target forwards.
RECOMPUTE_TAIL_COMMENT = (
    "A prefix-cache hit skips the target forward over the reused prompt, and the drafter's context comes only\n"
    "from target forwards: without a tail it would draft with no context after every hit. TensorRT-LLM reuses up\n"
    "to a block boundary that leaves at least this many prompt tokens to recompute (prefill rows per hit).")
# TensorRT-LLM's own DFlash test of a hybrid target (tests/unittest/_torch/speculative/test_dflash.py,
# test_dflash_qwen3_5_4b: Qwen3.5-4B + z-lab's drafter) runs it with block reuse and chunked prefill off; the state
# stays fp32 as in transformers' Gated DeltaNet and our runtime.
HYBRID_COMMENTS = {
    "enable_chunked_prefill": "Hybrid (Gated DeltaNet) target: off, as TensorRT-LLM's own Qwen3.5 DFlash test runs it.",
    "kv_cache_config.enable_block_reuse": "Hybrid target: a reused KV prefix carries no linear-attention state.",
    "kv_cache_config.mamba_ssm_cache_dtype": "The Gated DeltaNet recurrent state in fp32 (transformers' and the "
                                             "native runtime's precision):\nverify rows roll it back exactly.",
}
REJECTION_COMMENT = (
    "T > 0 requests accept drafts by rejection sampling against the drafter's distribution (lossless, and more\n"
    "accepted tokens than matching sampled tokens); greedy requests are unaffected.")


def llm_api_options(*, draft_dir: str, max_draft_len: int, mask_token_id: int, target_layer_ids: list[int],
                    max_seq_len: int, max_batch_size: int, max_num_tokens: int, kv_cache_dtype: str,
                    free_gpu_memory_fraction: float = 0.8, ep_size: int | None = None,
                    drafter_attention: str = "VANILLA", kv_cache_reuse: bool = False,
                    context_recompute_tail: int | None = None, rejection_sampling: bool = True,
                    hybrid: bool = False) -> dict:
    """The dict written to trtllm/dflash.yaml (passed with `--config`, alias `--extra_llm_api_options`).

    ep_size: MoE targets only (None for dense ones): `moe_expert_parallel_size`, the expert-parallel split of the
    tp ranks (the rest of each rank group splits every expert's intermediate dimension).
    drafter_attention: DFlashDecodingConfig.attention_backend (gpus.drafter_attention).
    kv_cache_reuse: prefix caching; then context_recompute_tail prompt tokens are recomputed after a hit."""
    kv = {"free_gpu_memory_fraction": free_gpu_memory_fraction, "enable_block_reuse": kv_cache_reuse}
    if kv_cache_dtype == "fp8":
        kv["dtype"] = "fp8"  # only with the k_scale / v_scale the ModelOpt export carries
    if hybrid:  # validate.check_hybrid_flags refuses --kv-cache-reuse for these
        kv |= {"enable_block_reuse": False, "mamba_ssm_cache_dtype": "float32"}
    moe = {} if ep_size is None else {"moe_expert_parallel_size": ep_size}
    spec = {
        "decoding_type": "DFlash",
        "speculative_model": draft_dir,
        "max_draft_len": max_draft_len,
        # explicit, although TensorRT-LLM would read the same from the drafter's dflash_config
        "mask_token_id": mask_token_id,
        "target_layer_ids": list(target_layer_ids),  # 0-based, used as-is by TensorRT-LLM
        "attention_backend": drafter_attention,
        "use_rejection_sampling": rejection_sampling,
    }
    if kv_cache_reuse:
        spec["context_recompute_tail"] = context_recompute_tail
    return {
        "speculative_config": spec,
        "max_seq_len": max_seq_len,  # always set: the drafter context arena is dense in max_seq_len
        "max_batch_size": max_batch_size,
        "max_num_tokens": max_num_tokens,
        "attn_backend": "TRTLLM",  # target attention; FLASHINFER is to be avoided with DFlash
        "enable_chunked_prefill": not hybrid,
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": max_batch_size},
        "kv_cache_config": kv,
        **moe,
    }


def yaml_comments(options: dict) -> dict[str, str]:
    """Comments for dflash.yaml, keyed by the dotted path of the key they explain."""
    spec = options["speculative_config"]
    out = {}
    if "mamba_ssm_cache_dtype" in options.get("kv_cache_config", {}):
        out.update(HYBRID_COMMENTS)
    if "context_recompute_tail" in spec:
        out["speculative_config.context_recompute_tail"] = RECOMPUTE_TAIL_COMMENT
    if spec.get("use_rejection_sampling"):
        out["speculative_config.use_rejection_sampling"] = REJECTION_COMMENT
    return out


def check_options(options: dict) -> None:
    """A YAML the pinned release would refuse is a bug of this writer, not of the user's flags."""
    found = problems(options)
    if found:
        raise RuntimeError(f"dflash.yaml does not fit TensorRT-LLM {TRTLLM_VERSION}: {'; '.join(found)}")


def default_max_num_tokens(max_seq_len: int, max_batch_size: int, max_draft_len: int) -> int:
    """Enough for a full batch of generation steps (each takes max_draft_len + 1 tokens), chunked prefill beyond."""
    return max(min(max_seq_len, 8192), max_batch_size * (max_draft_len + 1))


# -- a tiny YAML emitter (block style, deterministic; pyyaml is not a runtime dependency) ----------------------
_PLAIN = re.compile(r"^[A-Za-z0-9_./@+-][A-Za-z0-9_./@+ -]*$")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "~", "y", "n"}


def _scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v)
    if (_PLAIN.match(s) and s.lower() not in _RESERVED and not s.endswith(" ")
            and not re.match(r"^[-+]?[0-9.]", s)):
        return s
    return json.dumps(s)  # a JSON string is a valid YAML double-quoted scalar


def to_yaml(data: dict, indent: int = 0, comments: dict[str, str] | None = None, _path: str = "") -> str:
    """comments: {dotted key path: text}, written as `#` lines above that key."""
    lines = []
    pad = " " * indent
    comments = comments or {}
    for k, v in data.items():
        path = f"{_path}{k}"
        for line in comments.get(path, "").splitlines():
            lines.append(f"{pad}# {line}")
        if isinstance(v, dict):
            lines.append(f"{pad}{k}:")
            lines.append(to_yaml(v, indent + 2, comments, path + ".").rstrip("\n"))
        elif isinstance(v, (list, tuple)):
            lines.append(f"{pad}{k}: [{', '.join(_scalar(x) for x in v)}]")
        else:
            lines.append(f"{pad}{k}: {_scalar(v)}")
    return "\n".join(lines) + "\n"


# -- launch scripts ----------------------------------------------------------------------------------------------
_PRELUDE = """#!/usr/bin/env bash
# Generated by dflash-build {tool_version} for TensorRT-LLM {trt} (PyTorch backend, DFlash one-model speculation).
# Install the pinned release first:  pip install tensorrt_llm=={trt}
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
ENGINE="$(dirname "$HERE")"
CONFIG="$HERE/dflash.yaml"
# dflash.yaml names the drafter by absolute path; if this directory was moved, use a relocated copy.
if ! grep -qF "speculative_model: $ENGINE/draft" "$CONFIG" 2>/dev/null; then
  RELOC="$(mktemp "${{TMPDIR:-/tmp}}/dflash-XXXXXX.yaml")"
  sed "s#^\\(  speculative_model: \\).*#\\1\\"$ENGINE/draft\\"#" "$CONFIG" > "$RELOC"
  CONFIG="$RELOC"
fi
"""


def _common_flags(tp_size: int, max_seq_len: int, max_batch_size: int, max_num_tokens: int,
                  ep_size: int | None = None) -> str:
    ep = "" if ep_size is None else f" --ep_size {ep_size}"
    return (f"--backend {TRTLLM_BACKEND} --tp_size {tp_size}{ep} --max_seq_len {max_seq_len} "
            f"--max_batch_size {max_batch_size} --max_num_tokens {max_num_tokens}")


def serve_script(*, tool_version: str, tp_size: int, max_seq_len: int, max_batch_size: int,
                 max_num_tokens: int, ep_size: int | None = None) -> str:
    flags = _common_flags(tp_size, max_seq_len, max_batch_size, max_num_tokens, ep_size)
    return _PRELUDE.format(tool_version=tool_version, trt=TRTLLM_VERSION) + f"""
# Usage: trtllm/serve.sh [extra trtllm-serve flags]   (HOST / PORT from the environment)
exec trtllm-serve serve "$ENGINE/target" {flags} \\
  --config "$CONFIG" --host "${{HOST:-0.0.0.0}}" --port "${{PORT:-8000}}" "$@"
"""


def serve_multinode_script(*, tool_version: str, tp_size: int, max_seq_len: int, max_batch_size: int,
                           max_num_tokens: int, ep_size: int | None = None) -> str:
    flags = _common_flags(tp_size, max_seq_len, max_batch_size, max_num_tokens, ep_size)
    return _PRELUDE.format(tool_version=tool_version, trt=TRTLLM_VERSION) + f"""
# Usage: WORLD=<ranks> trtllm/serve_multinode.sh [extra trtllm-serve flags]
# One MPI rank per GPU across the nodes (on Slurm: srun ... trtllm-llmapi-launch trtllm-serve ... works too).
WORLD="${{WORLD:-{tp_size}}}"
exec mpirun -n "$WORLD" trtllm-llmapi-launch trtllm-serve serve "$ENGINE/target" {flags} \\
  --config "$CONFIG" --host "${{HOST:-0.0.0.0}}" --port "${{PORT:-8000}}" "$@"
"""


def bench_script(*, tool_version: str, model_name: str, tp_size: int, max_batch_size: int,
                 ep_size: int | None = None) -> str:
    ep = "" if ep_size is None else f" --ep {ep_size}"
    return _PRELUDE.format(tool_version=tool_version, trt=TRTLLM_VERSION) + f"""
# Usage: trtllm/bench.sh DATASET.jsonl [throughput|latency] [extra trtllm-bench flags]
# DATASET lines: {{"task_id": .., "prompt": ".." or "input_ids": [..], "output_tokens": N}}
DATASET="${{1:?usage: bench.sh DATASET.jsonl [throughput|latency] [flags]}}"
MODE="${{2:-throughput}}"
shift $(( $# >= 2 ? 2 : 1 ))
exec trtllm-bench --model {shlex.quote(model_name)} --model_path "$ENGINE/target" "$MODE" \\
  --dataset "$DATASET" --backend {TRTLLM_BACKEND} --tp {tp_size}{ep} --concurrency "${{CONCURRENCY:-{max_batch_size}}}" \\
  --config "$CONFIG" --report_json "${{REPORT:-bench_report.json}}" "$@"
"""
