"""Everything a build needs checked before any heavy work: flags, output directory, the pair, tp, formats."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
from dataclasses import dataclass, field

from dflash_trt.config import SUPPORTED_TARGETS, DraftConfig, TargetConfig
from . import families
from .errors import BuildError

QUANTIZATIONS = ("bf16", "fp8", "nvfp4")
KV_CACHE_DTYPES = ("auto", "fp8")
# Prompt tokens TensorRT-LLM recomputes after a prefix-cache hit so the drafter has context again. A few hundred
# tokens of recent context is what a DFlash drafter's attention mostly uses; 256 costs one modest prefill chunk.
DEFAULT_RECOMPUTE_TAIL = 256
SUPPORTED_DRAFT_TYPES = ("qwen3", "llama")  # TensorRT-LLM resolves the drafter decoder by model_type
# DFlash drafters released with another model_type: z-lab/gpt-oss-20b-DFlash's config.json (DFlashDraftModel) says
# "gpt_oss", a config derived from the target's. The weights are the usual Qwen3-style drafter, which our runtime
# builds whatever model_type says; TensorRT-LLM falls back on model_type and would build the target's architecture.
QWEN3_STYLE_DRAFT_TYPES = ("gpt_oss",)
NVFP4_GROUP = 16


@dataclass
class BuildPlan:
    target: str
    draft: str
    output: str
    quantization: str = "bf16"
    kv_cache_dtype: str = "auto"
    tp_size: int = 1
    ep_size: int = 1  # MoE targets: expert parallelism within the tp ranks (TensorRT-LLM's moe_expert_parallel_size)
    max_draft_len: int | None = None
    max_seq_len: int | None = None
    max_batch_size: int = 32
    max_num_tokens: int | None = None
    calib_data: str | None = None
    calib_samples: int = 64
    calib_max_tokens: int = 512
    force: bool = False
    gpu: str | None = None  # the serving GPU (gpus.GPUS); None: a portable build
    kv_cache_reuse: bool = False  # prefix caching on every stack's launch files
    context_recompute_tail: int | None = None  # with kv_cache_reuse (None: DEFAULT_RECOMPUTE_TAIL)
    rejection_sampling: bool = True  # TensorRT-LLM's use_rejection_sampling, for T > 0 requests
    # filled in by validate_plan
    tcfg: TargetConfig | None = field(default=None, repr=False)
    dcfg: DraftConfig | None = field(default=None, repr=False)
    target_raw: dict = field(default_factory=dict, repr=False)
    target_shapes: dict = field(default_factory=dict, repr=False)
    calib_texts: list | None = field(default=None, repr=False)
    architecture: str = ""
    warnings: list = field(default_factory=list)  # one line each, printed by the build (even with --quiet)

    @property
    def uses_modelopt(self) -> bool:
        return self.quantization != "bf16" or self.kv_cache_dtype == "fp8"


def _is_within(path: str, parent: str) -> bool:
    path, parent = os.path.realpath(path), os.path.realpath(parent)
    return path == parent or path.startswith(parent.rstrip(os.sep) + os.sep)


def tp_sizes() -> tuple[int, ...]:
    """The native runtime's sizes: an engine directory must be servable by dflash-serve too."""
    from dflash_trt.tensor_parallel import TP_SIZES

    return tuple(TP_SIZES)


def check_flags(plan: BuildPlan) -> None:
    from .gpus import check_gpu

    if plan.quantization not in QUANTIZATIONS:
        raise BuildError(f"--quantization {plan.quantization!r} is unknown: use one of {', '.join(QUANTIZATIONS)}")
    if plan.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise BuildError(f"--kv-cache-dtype {plan.kv_cache_dtype!r} is unknown: use auto or fp8")
    sizes = tp_sizes()
    if plan.tp_size not in sizes:
        raise BuildError(f"--tp-size {plan.tp_size} is not supported: use {', '.join(map(str, sizes[:-1]))} or "
                         f"{sizes[-1]} (the sizes dflash-serve and dflash-generate split a model by)")
    if plan.ep_size < 1 or plan.tp_size % plan.ep_size:
        raise BuildError(f"--ep-size {plan.ep_size} must divide --tp-size {plan.tp_size} (TensorRT-LLM splits the "
                         "tp ranks into expert-parallel groups): use a divisor of the tp size")
    for flag, v in (("--max-batch-size", plan.max_batch_size), ("--calib-samples", plan.calib_samples),
                    ("--max-seq-len", plan.max_seq_len), ("--max-num-tokens", plan.max_num_tokens),
                    ("--max-draft-len", plan.max_draft_len)):
        if v is not None and v < 1:
            raise BuildError(f"{flag} {v} must be a positive integer")
    check_gpu(plan.gpu, plan.quantization)
    if plan.context_recompute_tail is not None:
        if not plan.kv_cache_reuse:
            raise BuildError("--context-recompute-tail only applies with --kv-cache-reuse: add --kv-cache-reuse or "
                             "drop --context-recompute-tail")
        if plan.context_recompute_tail < 0:
            raise BuildError(f"--context-recompute-tail {plan.context_recompute_tail} must be 0 or more")
    elif plan.kv_cache_reuse:
        plan.context_recompute_tail = DEFAULT_RECOMPUTE_TAIL


def check_output(plan: BuildPlan) -> None:
    out = plan.output = os.path.abspath(plan.output)
    for flag, src in (("--target", plan.target), ("--draft", plan.draft), ("--calib-data", plan.calib_data)):
        if src and os.path.exists(src) and _is_within(src, out):
            raise BuildError(f"--output {out} would overwrite the {flag} source {src}: choose another --output")
    if os.path.lexists(out) and not plan.force:
        raise BuildError(f"output {out} already exists: pass --force to replace it, or choose another --output")
    parent = os.path.dirname(out)
    probe = parent
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe and not os.path.isdir(probe):
        raise BuildError(f"cannot create --output {out}: {probe} is a file, not a directory")
    if probe and not os.access(probe, os.W_OK):
        raise BuildError(f"cannot write --output {out}: {probe} is not writable (choose another --output)")


def _check_dir(path: str, flag: str, what: str) -> str:
    if not path:
        raise BuildError(f"{flag} is required: give the {what} checkpoint directory")
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise BuildError(f"{flag} {path}: directory not found (give the {what} checkpoint directory)")
    if not os.path.isdir(path):
        raise BuildError(f"{flag} {path} is not a directory (give the {what} checkpoint directory)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise BuildError(f"{flag} {path} has no config.json: give a Hugging Face-format {what} checkpoint directory")
    if not os.access(os.path.join(path, "config.json"), os.R_OK):
        raise BuildError(f"{flag} {path}/config.json is not readable: fix its permissions")
    return path


def valid_tp_sizes(counts: list[int]) -> list[int]:
    g = 0
    for c in counts:
        g = math.gcd(g, c)
    return [t for t in tp_sizes() if g % t == 0]


def check_tp(plan: BuildPlan) -> None:
    t, d, tp = plan.tcfg, plan.dcfg, plan.tp_size
    if families.hybrid(t) and tp > 1:
        raise BuildError(f"--tp-size {tp} is not supported for {t.model_type}: tensor parallelism does not shard "
                         "the Gated DeltaNet layers of hybrid targets here (dflash-serve refuses it too): use "
                         "--tp-size 1")
    constraints = [("target num_attention_heads", t.num_attention_heads),
                   ("target num_key_value_heads", t.num_key_value_heads),
                   ("target intermediate_size", t.intermediate_size),
                   ("drafter num_attention_heads", d.num_attention_heads),
                   ("drafter num_key_value_heads", d.num_key_value_heads),
                   ("drafter intermediate_size", d.intermediate_size)]
    for name, n in constraints:
        if n % tp:
            ok = valid_tp_sizes([c for _, c in constraints])
            raise BuildError(f"--tp-size {tp} does not divide the {name} ({n}): use --tp-size "
                             f"{' or '.join(map(str, ok))}")
    moe = t.moe
    if plan.ep_size > 1 and moe is None:
        raise BuildError(f"--ep-size {plan.ep_size} needs a mixture-of-experts target; {t.model_type} is dense: "
                         "drop --ep-size")
    if moe is not None and moe.num_experts % plan.ep_size:
        raise BuildError(f"--ep-size {plan.ep_size} does not divide the target's {moe.num_experts} experts: use a "
                         "divisor of num_experts")
    if moe is not None and moe.intermediate_size % (tp // plan.ep_size):
        raise BuildError(f"--tp-size {tp} / --ep-size {plan.ep_size} = {tp // plan.ep_size} does not divide the "
                         f"expert intermediate_size ({moe.intermediate_size}): raise --ep-size")


def check_hybrid_flags(plan: BuildPlan, given_num_tokens: int | None = None) -> None:
    """Hybrid targets run in TensorRT-LLM as its own Qwen3.5 DFlash test runs them: no block reuse, no chunked
    prefill, so a whole prompt is one iteration's tokens."""
    if not families.hybrid(plan.tcfg):
        return
    mt = plan.tcfg.model_type
    if plan.kv_cache_reuse:
        raise BuildError(f"--kv-cache-reuse is not supported for {mt}: a cached prefix carries no Gated DeltaNet "
                         "state (TensorRT-LLM's own Qwen3.5 DFlash test and dflash-serve run these targets without "
                         "block reuse): drop --kv-cache-reuse")
    if given_num_tokens is None:
        plan.max_num_tokens = max(plan.max_num_tokens, plan.max_seq_len)
    elif given_num_tokens < plan.max_seq_len:
        raise BuildError(f"--max-num-tokens {given_num_tokens} is below --max-seq-len {plan.max_seq_len}: {mt} "
                         "runs without chunked prefill in TensorRT-LLM, so a prompt must fit one iteration: raise "
                         "--max-num-tokens or lower --max-seq-len")


def check_nvfp4_shapes(plan: BuildPlan) -> None:
    """NVFP4 packs 16-element blocks along in_features, and tensor parallelism splits the row-parallel inputs.
    Families whose NVFP4 recipe quantizes only some linears (families.exclusions) check those."""
    t, tp = plan.tcfg, plan.tp_size
    head = t.head_dim if t.mla is None else t.mla.v_head_dim  # MLA: o_proj reads v_head_dim per head
    checks = families.nvfp4_inputs(t, tp, plan.ep_size) or [
        ("hidden_size (q/k/v/gate/up in_features)", t.hidden_size, 1),
        ("num_attention_heads x head_dim (o_proj in_features per rank)", t.num_attention_heads * head, tp),
        ("intermediate_size (down_proj in_features per rank)", t.intermediate_size, tp)]
    for name, n, split in checks:
        if n % split or (n // split) % NVFP4_GROUP:
            raise BuildError(f"--quantization nvfp4 needs in_features divisible by {NVFP4_GROUP}"
                             f"{' per tp rank' if split > 1 else ''}, but the target {name} is {n}"
                             f"{f' / tp {split}' if split > 1 else ''}: use --quantization fp8"
                             f"{' or a smaller --tp-size' if split > 1 else ''}")


def check_modelopt() -> None:
    missing = [m for m in ("modelopt", "requests") if importlib.util.find_spec(m) is None]
    if missing:
        raise BuildError(f"quantization needs NVIDIA ModelOpt ({', '.join(missing)} not installed): "
                         "pip install nvidia-modelopt requests pyyaml (or dflash-trt[quant]), or use "
                         "--quantization bf16 --kv-cache-dtype auto")


def _read_json(path: str, flag: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise BuildError(f"{flag} {path} is unreadable: {e} (fix or replace the file)") from None
    if not isinstance(data, dict):
        raise BuildError(f"{flag} {path} is not a JSON object (fix or replace the file)")
    return data


def check_target(plan: BuildPlan) -> None:
    raw = plan.target_raw = _read_json(os.path.join(plan.target, "config.json"), "--target config")
    archs = raw.get("architectures") or []
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_TARGETS:
        raise BuildError(f"--target architecture {model_type!r} ({', '.join(archs) or 'no architectures'}) is not "
                         f"supported: dflash-build handles {', '.join(SUPPORTED_TARGETS.values())} targets")
    expected = SUPPORTED_TARGETS[model_type]
    accepted = families.ARCHITECTURE_ALIASES.get(model_type, (expected,))
    if archs and not set(accepted) & set(archs):
        raise BuildError(f"--target architectures {archs} are not supported for model_type {model_type!r}: "
                         f"give a {expected} checkpoint (a causal LM with an lm_head)")
    plan.architecture = families.TRTLLM_ARCHITECTURE.get(model_type, expected)
    method = (raw.get("quantization_config") or {}).get("quant_method")
    if method == "mxfp4" and model_type == "gpt_oss":  # the gpt-oss release: experts stay MXFP4, as TRT-LLM runs them
        if plan.quantization != "bf16" or plan.kv_cache_dtype != "auto":
            raise BuildError("--target is the MXFP4 gpt-oss release: its experts are kept as released, so build it "
                             "with --quantization bf16 --kv-cache-dtype auto (or start from a bf16 checkpoint)")
        return
    if raw.get("quantization_config") or os.path.isfile(os.path.join(plan.target, "hf_quant_config.json")):
        raise BuildError(f"--target {plan.target} is already quantized: give the original bf16/fp16 checkpoint "
                         "(dflash-build quantizes it itself)")


def read_target_shapes(plan: BuildPlan) -> None:
    """Every safetensors header of the target (missing / unreadable files fail here, before any model import)."""
    from dflash_trt.checkpoint import tensor_shapes

    plan.target_shapes = tensor_shapes(plan.target, "target")


def weight_names(plan: BuildPlan) -> families.WeightNames:
    return families.WeightNames(plan.tcfg.model_type, plan.target_shapes,
                                wrapper="text_config" in (plan.target_raw or {}))


def check_target_weights(plan: BuildPlan) -> None:
    """The weights config.json implies, by canonical name (families.WeightNames: wrapper prefixes, MiniMax-M2's
    Mixtral names), each missing or mis-shaped one named as this checkpoint spells it."""
    names = weight_names(plan)
    shapes = names.canonical_shapes(plan.target_shapes)
    t = plan.tcfg
    want = {"model.embed_tokens.weight": [t.vocab_size, t.hidden_size]}
    want |= _hybrid_weights(t) if families.hybrid(t) else _attention_weights(t)
    for layer in (0, t.num_hidden_layers - 1):
        want |= _mlp_weights(t, layer, shapes)
    for name, shape in want.items():
        if name not in shapes:
            raise BuildError(f"--target {plan.target} weights lack {names.spell(name)}: the safetensors do not "
                             "belong to this config.json (give a complete Hugging Face checkpoint)")
        if shapes[name][0] != shape:
            raise BuildError(f"--target weight {names.spell(name)} has shape {shapes[name][0]}, config.json implies "
                             f"{shape}: config.json does not match the weights")
    check_expert_tensors(plan, shapes, names)


_EXPERT = re.compile(r"^model\.layers\.(\d+)\.(?:mlp\.)?experts\.(.+)$")
FUSED_KINDS = ("gate_up_proj", "down_proj")


def check_expert_tensors(plan: BuildPlan, shapes: dict | None = None,
                         names: families.WeightNames | None = None) -> None:
    """Every MoE layer's experts are in the safetensors (names only: headers, no weights read). A bf16 build never
    loads the target, so a truncated checkpoint would otherwise build and fail only where it is served.

    Fused layouts (gpt-oss, or transformers 5's in-memory layout): experts.gate_up_proj / experts.down_proj, each
    in bf16 or as the MXFP4 release's `<name>_blocks` + `<name>_scales`, plus `<name>_bias` where the family has
    expert biases. One-by-one layouts: experts.<e>.{gate,up,down}_proj.weight for every expert (and `.bias`).
    The message names the missing tensor as this checkpoint would spell it."""
    t = plan.tcfg
    names = names or weight_names(plan)
    shapes = shapes if shapes is not None else names.canonical_shapes(plan.target_shapes)
    moe = t.moe
    if moe is None:
        return
    by_layer: dict[int, set] = {}
    for name in shapes:
        m = _EXPERT.match(name)
        if m:
            by_layer.setdefault(int(m.group(1)), set()).add(m.group(2))
    mxfp4 = ((plan.target_raw or {}).get("quantization_config") or {}).get("quant_method") == "mxfp4" or any(
        n.endswith(("gate_up_proj_blocks", "down_proj_blocks")) for names in by_layer.values() for n in names)
    for layer in range(t.num_hidden_layers):
        if layer in moe.dense_layers:
            continue
        p = f"model.layers.{layer}.{families.experts_module(t.model_type)}."
        have = by_layer.get(layer, set())
        missing = _missing_expert_tensor(t, have, mxfp4)
        if missing is not None:
            name, what = missing
            raise BuildError(f"--target {plan.target} weights lack {names.spell(p + name)} ({what}): a truncated "
                             "or incomplete checkpoint (give a complete Hugging Face checkpoint)")


def _missing_expert_tensor(t: TargetConfig, have: set, mxfp4: bool) -> tuple[str, str] | None:
    """(name within `experts.`, description) of the first tensor a layer's experts lack, or None."""
    moe = t.moe
    fused = any(n.split(".")[0] in FUSED_KINDS or n.startswith(tuple(k + "_" for k in FUSED_KINDS)) for n in have)
    per_expert = any(n.split(".")[0].isdigit() for n in have)
    if per_expert or not (fused or t.model_type == "gpt_oss"):
        for e in range(moe.num_experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                for part in ("weight", "bias") if moe.bias else ("weight",):
                    if f"{e}.{proj}.{part}" not in have:
                        return f"{e}.{proj}.{part}", f"expert {e} of {moe.num_experts}"
        return None
    for kind in FUSED_KINDS:
        if kind + "_blocks" in have and kind + "_scales" not in have:
            return kind + "_scales", f"the MXFP4 scales of {kind}_blocks"
        if kind not in have and kind + "_blocks" not in have:
            if mxfp4:
                return kind + "_blocks", f"the fused expert weights, MXFP4 {kind}_blocks / {kind}_scales or bf16 {kind}"
            return kind, f"the fused expert weights, bf16 {kind} or MXFP4 {kind}_blocks / {kind}_scales"
        if moe.bias and kind + "_bias" not in have:
            return kind + "_bias", f"the expert biases of {kind}"
    return None


def _attention_weights(t: TargetConfig) -> dict:
    p = "model.layers.0.self_attn."
    a = t.mla
    if a is None:  # Gemma 4: per-layer head dims (layer_head_dims)
        head = (getattr(t, "layer_head_dims", None) or [t.head_dim])[0]
        return {p + "q_proj.weight": [t.num_attention_heads * head, t.hidden_size]}
    heads = t.num_attention_heads
    want = {p + "kv_a_proj_with_mqa.weight": [a.kv_lora_rank + a.qk_rope_head_dim, t.hidden_size],
            p + "kv_b_proj.weight": [heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank]}
    if a.q_lora_rank is None:
        return want | {p + "q_proj.weight": [heads * a.qk_head_dim, t.hidden_size]}
    return want | {p + "q_a_proj.weight": [a.q_lora_rank, t.hidden_size],
                   p + "q_b_proj.weight": [heads * a.qk_head_dim, a.q_lora_rank]}


def _hybrid_weights(t: TargetConfig) -> dict:
    """A hybrid's first full-attention layer (gated q_proj: a query and a gate per head) and first Gated DeltaNet
    layer (Qwen3.5's in_proj_qkv or Qwen3-Next's grouped in_proj_qkvz, the depthwise conv, out_proj)."""
    h, d = t.hybrid, t.hybrid.deltanet
    want = {}
    if h.attention_layers:
        p = f"model.layers.{h.attention_layers[0]}.self_attn."
        want[p + "q_proj.weight"] = [t.num_attention_heads * t.head_dim * 2, t.hidden_size]
        want[p + "o_proj.weight"] = [t.hidden_size, t.num_attention_heads * t.head_dim]
    if h.linear_layers:
        p = f"model.layers.{h.linear_layers[0]}.linear_attn."
        k, v = d.num_k_heads * d.head_k_dim, d.num_v_heads * d.head_v_dim
        if d.fused_qkvz:
            want[p + "in_proj_qkvz.weight"] = [2 * k + 2 * v, t.hidden_size]
        else:
            want[p + "in_proj_qkv.weight"] = [2 * k + v, t.hidden_size]
        want[p + "conv1d.weight"] = [2 * k + v, 1, d.conv_kernel]
        want[p + "out_proj.weight"] = [t.hidden_size, v]
    return want


def _mlp_weights(t: TargetConfig, layer: int, shapes: dict) -> dict:
    """A layer's MLP weights the config implies: dense SwiGLU, or a router plus experts (one by one or fused)."""
    p = f"model.layers.{layer}.mlp."
    moe = t.moe
    inter = (getattr(t, "layer_intermediate", None) or [t.intermediate_size] * t.num_hidden_layers)[layer]
    dense = {p + "gate_proj.weight": [inter, t.hidden_size], p + "down_proj.weight": [t.hidden_size, inter]}
    if moe is None or layer in moe.dense_layers:
        return dense
    if t.model_type in families.GEMMA4:  # a dense MLP beside the experts, and its own router
        return dense | {f"model.layers.{layer}.router.proj.weight": [moe.num_experts, t.hidden_size]}
    router = "router" if moe.router == "topk_softmax" else "gate"
    want = {p + router + ".weight": [moe.num_experts, t.hidden_size]}
    if p + "experts.0.gate_proj.weight" in shapes or not any(n.startswith(p + "experts.") and n.count(".") == 5
                                                            for n in shapes):
        want[p + "experts.0.gate_proj.weight"] = [moe.intermediate_size, t.hidden_size]
    shared = t.hybrid.shared_expert_intermediate_size if families.hybrid(t) else 0
    if shared:
        want[p + "shared_expert.gate_proj.weight"] = [shared, t.hidden_size]
    return want  # every MoE layer's expert tensors: check_expert_tensors


def draft_model_type(raw: dict) -> str | None:
    """The drafter decoder's model_type: top level (z-lab), or the nested layer config (speculators, whose
    default is Qwen3, as DraftConfig reads it)."""
    if "speculators_model_type" in raw:
        return (raw.get("transformer_layer_config") or {}).get("model_type", "qwen3")
    return raw.get("model_type")


def check_draft(plan: BuildPlan) -> None:
    d = plan.dcfg
    model_type = draft_model_type(d.raw)
    if model_type in QWEN3_STYLE_DRAFT_TYPES and "DFlashDraftModel" in (d.raw.get("architectures") or []):
        fallback = "".join(w.capitalize() for w in model_type.split("_")) + "ForCausalLM"  # TensorRT-LLM's rule
        plan.warnings.append(
            f"--draft model_type {model_type!r} (as z-lab's gpt-oss drafters ship it) names the target's "
            "architecture, not the drafter's Qwen3-style decoder: dflash-serve runs this engine, but TensorRT-LLM "
            f"picks the drafter decoder by model_type and would build {fallback}; for trtllm-serve, rebuild from a "
            'copy of the drafter whose config.json says "model_type": "qwen3" (same weights)')
    elif model_type not in SUPPORTED_DRAFT_TYPES:
        raise BuildError(f"--draft model_type {model_type!r} is not supported by TensorRT-LLM's DFlash drafter "
                         f"loader: it needs a {' or '.join(SUPPORTED_DRAFT_TYPES)} decoder config (z-lab format)")
    if d.raw.get("quantization_config"):
        raise BuildError("--draft is quantized: TensorRT-LLM slices the drafter's raw projection weights, so give "
                         "the BF16 drafter")


def check_draft_vocab(plan: BuildPlan) -> None:
    """A speculators drafter's pruned vocabulary (d2t / t2d) has no place in what TensorRT-LLM reads: its
    DFlashForCausalLM shares the target's embedding and whole lm_head and loads no d2t / t2d, so it would draft
    from logits over the whole vocabulary, not the ones the drafter was trained to rank."""
    raw, v = plan.dcfg.raw, plan.tcfg.vocab_size
    n = raw.get("draft_vocab_size")
    if "speculators_model_type" in raw and n is not None and n != v:
        raise BuildError(f"--draft has a pruned draft vocabulary (draft_vocab_size {n} of the target's {v}, d2t / "
                         "t2d maps) that TensorRT-LLM's DFlash drafter cannot read (it drafts over the target's whole "
                         "lm_head): serve this pair natively with dflash-serve --target TARGET --draft DRAFT, or give "
                         "a drafter with the full vocabulary")


def check_draft_len(plan: BuildPlan) -> None:
    d = plan.dcfg
    if plan.max_draft_len is None:
        plan.max_draft_len = d.block_size - 1
    if plan.max_draft_len >= d.block_size:
        raise BuildError(f"--max-draft-len {plan.max_draft_len} must be below the drafter block_size "
                         f"{d.block_size}: use --max-draft-len {d.block_size - 1} or less")


def check_lengths(plan: BuildPlan) -> None:
    t = plan.tcfg
    check_draft_len(plan)
    if plan.max_seq_len is None:
        plan.max_seq_len = min(8192, t.max_position_embeddings)
    if plan.max_seq_len > t.max_position_embeddings:
        raise BuildError(f"--max-seq-len {plan.max_seq_len} exceeds the target's max_position_embeddings "
                         f"{t.max_position_embeddings}: use --max-seq-len {t.max_position_embeddings} or less")
    if plan.max_seq_len < plan.max_draft_len + 2:
        raise BuildError(f"--max-seq-len {plan.max_seq_len} leaves no room for a draft block: use at least "
                         f"{plan.max_draft_len + 2}")
    need = plan.max_draft_len + 1
    if plan.max_num_tokens is None:
        from .trtllm import default_max_num_tokens
        plan.max_num_tokens = default_max_num_tokens(plan.max_seq_len, plan.max_batch_size, plan.max_draft_len)
    elif plan.max_num_tokens < need:
        raise BuildError(f"--max-num-tokens {plan.max_num_tokens} is below one generation step "
                         f"(max_draft_len + 1 = {need}): use --max-num-tokens {need} or more")


def validate_plan(plan: BuildPlan) -> BuildPlan:
    """Raises a DFlashError (one-line message) on the first problem; fills in configs and defaults.

    Cheap checks first (flags, paths, raw configs, safetensors headers, calibration file), so most mistakes are
    reported before transformers is even imported; then the pair (load_configs -> validate_pair) and what
    depends on the parsed configs.
    """
    from .calib import load_texts

    check_flags(plan)
    plan.target = _check_dir(plan.target, "--target", "target")
    plan.draft = _check_dir(plan.draft, "--draft", "drafter")
    check_output(plan)
    check_target(plan)
    read_target_shapes(plan)
    plan.dcfg = DraftConfig.from_dir(plan.draft, num_target_layers=plan.target_raw.get("num_hidden_layers"))
    check_draft(plan)
    check_draft_len(plan)
    if plan.uses_modelopt:
        check_modelopt()
        if plan.calib_data is not None:
            plan.calib_data = os.path.abspath(plan.calib_data)
        plan.calib_texts = load_texts(plan.calib_data, plan.calib_samples)
    elif plan.calib_data is not None:
        plan.calib_data = os.path.abspath(plan.calib_data)
    from dflash_trt.loader import ModelPaths, load_configs

    plan.tcfg, plan.dcfg = load_configs(ModelPaths(plan.target, plan.draft))  # validate_pair runs inside
    check_draft_vocab(plan)
    given_num_tokens = plan.max_num_tokens
    check_lengths(plan)
    check_tp(plan)
    check_hybrid_flags(plan, given_num_tokens)
    check_target_weights(plan)
    if plan.quantization == "nvfp4":
        check_nvfp4_shapes(plan)
    return plan
