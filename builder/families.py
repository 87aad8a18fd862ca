"""What dflash-build needs per target family beyond TargetConfig: how a checkpoint spells its language-model
weights, what ModelOpt must leave unquantized, the names and options TensorRT-LLM reads.

- Names. The weight checks speak canonical names (`model.layers.<i>.mlp...`, `lm_head.weight`); WeightNames maps a
  checkpoint's own spelling to them and back, so a message names the tensor as the checkpoint spells it:
  Kimi K2.5 / K2.6 (`kimi_k25`) keep the DeepSeek-V3 language model under `language_model.model.*` /
  `language_model.lm_head.*` (the release, and what TensorRT-LLM's KimiK25ForConditionalGeneration strips), under
  `language_model.model.blocks.*` (transformers 5.24's save_pretrained) or `model.language_model.*` / `lm_head.*`
  (transformers in memory, hence ModelOpt's export); the multimodal Qwen3.5 wrappers under
  `model.language_model.*`; MiniMax-M2 spells its MoE block `block_sparse_moe` with Mixtral's w1 / w3 / w2.
- Quantization. ModelOpt 0.47's FP8_DEFAULT_CFG / NVFP4_DEFAULT_CFG already leave routers (`*mlp.gate.*`,
  `*block_sparse_moe.gate*`, `*shared_expert_gate*`), `*vision_tower*` / `*visual*`, `mtp.*`, `lm_head` and, for
  Gated DeltaNet, `linear_attn.conv1d` and `linear_attn.in_proj_a` / `in_proj_b` (and Qwen3-Next's `in_proj_ba`)
  unquantized. exclusions() adds what NVIDIA's published checkpoints of the family also keep out, each with why.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

KIMI = "kimi_k25"
GEMMA4 = ("gemma4", "gemma4_text")
WRAPPERS = ("kimi_k25", "qwen3_5", "qwen3_5_moe", "gemma4")  # multimodal checkpoints served text-only
HYBRID = ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
# TensorRT-LLM registers Kimi K2.5's wrapper as the release spells it (no underscore, unlike transformers)
TRTLLM_ARCHITECTURE = {KIMI: "KimiK25ForConditionalGeneration"}
ARCHITECTURE_ALIASES = {KIMI: ("Kimi_K25ForConditionalGeneration", "KimiK25ForConditionalGeneration")}

_MIXTRAL = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_MIXTRAL_BACK = {v: k for k, v in _MIXTRAL.items()}
_MIXTRAL_EXPERT = re.compile(r"^(.*\.experts\.\d+)\.(w1|w2|w3)\.(.+)$")
_CANON_EXPERT = re.compile(r"^(.*\.experts\.\d+)\.(gate_proj|up_proj|down_proj)\.(.+)$")

# Kimi K2.5 layouts: (language-model prefix, the layer-list word, lm_head prefix)
KIMI_RELEASE = ("language_model.model.", "layers", "language_model.lm_head.")
KIMI_SAVED = ("language_model.model.", "blocks", "language_model.lm_head.")
KIMI_MEMORY = ("model.language_model.", "layers", "lm_head.")


def _kimi_layout(names) -> tuple[str, str, str]:
    names = list(names)
    if any(n.startswith("language_model.model.blocks.") for n in names):
        return KIMI_SAVED
    if any(n.startswith("language_model.") for n in names):
        return KIMI_RELEASE
    return KIMI_MEMORY


class WeightNames:
    """A checkpoint's tensor names <-> canonical ones. canonical() is None for tensors outside the language model
    (vision tower, projector, multi-token-prediction layers)."""

    def __init__(self, model_type: str, names, wrapper: bool | None = None):
        self.model_type = model_type
        names = list(names)
        self.kimi = _kimi_layout(names) if model_type == KIMI else None
        if wrapper is None:
            wrapper = any(n.startswith("model.language_model.") for n in names)
        self.qwen_wrapper = (model_type in HYBRID or model_type in GEMMA4) and wrapper
        self.mixtral = model_type == "minimax_m2" and any(".block_sparse_moe." in n for n in names)
        self.mixtral_experts = model_type == "minimax_m2" and any(_MIXTRAL_EXPERT.match(n) for n in names)

    def canonical(self, name: str) -> str | None:
        if self.kimi is not None:
            lang, word, head = self.kimi
            if name.startswith(head):
                return "lm_head." + name[len(head):]
            if not name.startswith(lang):
                return None
            rest = name[len(lang):]
            if rest.startswith(word + "."):
                rest = "layers." + rest[len(word) + 1:]
            return "model." + rest
        if self.model_type in HYBRID or self.model_type in GEMMA4:
            if name.startswith(("mtp.", "model.mtp.", "model.visual.", "visual.", "model.vision_tower.",
                                "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")):
                return None
            if self.qwen_wrapper and name.startswith("model.language_model."):
                return "model." + name[len("model.language_model."):]
            return name
        if self.model_type == "minimax_m2":
            name = name.replace(".block_sparse_moe.", ".mlp.")
            m = _MIXTRAL_EXPERT.match(name)
            return f"{m.group(1)}.{_MIXTRAL[m.group(2)]}.{m.group(3)}" if m else name
        return name

    def spell(self, canonical: str, layout: tuple[str, str, str] | None = None) -> str:
        """The canonical name as this checkpoint (or, for Kimi, the given layout) spells it."""
        kimi = layout or self.kimi
        if kimi is not None:
            lang, word, head = kimi
            if canonical.startswith("lm_head."):
                return head + canonical[len("lm_head."):]
            rest = canonical[len("model."):]
            if rest.startswith("layers."):
                rest = word + "." + rest[len("layers."):]
            return lang + rest
        if self.qwen_wrapper and canonical.startswith("model."):
            return "model.language_model." + canonical[len("model."):]
        if self.mixtral:
            name = canonical.replace(".mlp.", ".block_sparse_moe.")
            m = _CANON_EXPERT.match(name)
            if m and self.mixtral_experts:
                name = f"{m.group(1)}.{_MIXTRAL_BACK[m.group(2)]}.{m.group(3)}"
            return name
        return canonical

    def canonical_shapes(self, shapes: dict) -> dict:
        out = {}
        for name, v in shapes.items():
            c = self.canonical(name)
            if c is not None:
                out[c] = v
        return out


@dataclass(frozen=True)
class Exclusion:
    """ModelOpt quantizer-name patterns (transformers' in-memory module names) kept unquantized, and why."""
    patterns: tuple[str, ...]
    modules: str  # what they are, for the build log and engine.json
    why: str


# NVIDIA's NVFP4 releases of MoE models (nvidia/DeepSeek-R1-FP4, nvidia/Kimi-K2.5-NVFP4 / K2.6, nvidia/Qwen3.5-397B-
# A17B-NVFP4) quantize only the linear layers of the MoE blocks: attention and the rest stay BF16.
_EXPERTS_ONLY = "NVIDIA's NVFP4 releases of MoE models (DeepSeek-R1-FP4, Kimi-K2.5 / K2.6-NVFP4) quantize only the MoE experts"
# The full-attention layers are matched by their projections only: `self_attn.k_bmm_quantizer` / `v_bmm_quantizer`
# are the FP8 KV cache's, which --kv-cache-dtype fp8 still wants.
_ATTENTION = ("*self_attn.*proj*",)


def exclusions(tcfg, quantization: str) -> list[Exclusion]:
    """What this build keeps out of ModelOpt's quantization beyond ModelOpt's own defaults (listed above)."""
    if quantization == "bf16":
        return []
    mt, out = tcfg.model_type, []
    if mt == KIMI:
        out.append(Exclusion(("*mm_projector*",), "the vision projector (mm_projector)",
                             "a text-only build calibrates no image inputs, and NVIDIA's Kimi-K2.5 / K2.6 NVFP4 "
                             "releases keep the vision tower and projector BF16"))
    if quantization != "nvfp4":
        return out
    if mt in (KIMI, "minimax_m2"):
        dense = list(tcfg.moe.dense_layers if tcfg.moe else [])
        pats = _ATTENTION + (("*shared_experts*",) if mt == KIMI else ()) + tuple(
            f"*layers.{i}.mlp.*" for i in dense)
        what = "attention" + (", shared experts" if mt == KIMI else "") + (
            f", the dense MLP of layer(s) {', '.join(map(str, dense))}" if dense else "")
        out.append(Exclusion(pats, what, f"{_EXPERTS_ONLY}; "
                             + ("no NVIDIA MiniMax-M2 NVFP4 release was read, so the same split is used"
                                if mt == "minimax_m2" else "the rest stays BF16")))
    elif mt in HYBRID:
        out.append(Exclusion(("*linear_attn.*",) + _ATTENTION,
                             "the Gated DeltaNet (linear_attn) and full-attention (self_attn) projections",
                             "NVIDIA's Qwen3.6-27B / 35B-A3B NVFP4 checkpoints keep them out of NVFP4 (FP8 there, "
                             "a mixed-precision export; BF16 in nvidia/Qwen3.5-397B-A17B-NVFP4): a linear layer's "
                             "error enters the recurrent state and stays in every later token; this single-format "
                             "NVFP4 build keeps them BF16 (use --quantization fp8 for FP8 attention)"))
    return out


def disable_entries(exclusions_: list[Exclusion]) -> list[dict]:
    """ModelOpt 0.47 quant_cfg entries (a list, applied in order, the last match winning)."""
    return [{"quantizer_name": p, "enable": False} for e in exclusions_ for p in e.patterns]


def default_exclusions(tcfg, quantization: str) -> list[Exclusion]:
    """ModelOpt's own default exclusions that matter for this family, for the build log and engine.json: not
    ours to add, but what stays unquantized should be said."""
    if quantization == "bf16":
        return []
    out = [Exclusion((), "lm_head and the embeddings", "ModelOpt default")]
    if tcfg.moe is not None:
        out.append(Exclusion((), "the MoE routers", "ModelOpt default: routing decisions are sensitive to "
                                                   "quantization noise"))
    if tcfg.model_type in HYBRID:
        out.append(Exclusion((), "linear_attn.conv1d and linear_attn.in_proj_a / in_proj_b (in_proj_ba)",
                             "ModelOpt default: the short causal convolution, and the per-head gate projections "
                             "(out_features = the number of value heads)"))
    if tcfg.model_type in WRAPPERS:
        out.append(Exclusion((), "the vision tower", "ModelOpt default; the target is served text-only"))
    return out


def nvfp4_inputs(tcfg, tp: int, ep: int) -> list[tuple[str, int, int]] | None:
    """(what, in_features, split) of every linear NVFP4 quantizes in this family, None: the generic checks
    (every decoder projection). NVFP4 packs 16-element blocks along in_features."""
    mt = tcfg.model_type
    if mt not in (KIMI, "minimax_m2") and mt not in HYBRID:
        return None
    out = [("hidden_size (gate/up in_features)", tcfg.hidden_size, 1)]
    if tcfg.moe is not None:
        out.append(("expert intermediate_size (down_proj in_features per rank)", tcfg.moe.intermediate_size,
                    max(1, tp // ep)))
    if mt in HYBRID:
        h = tcfg.hybrid
        if tcfg.moe is None or len(tcfg.moe.dense_layers) or not h.shared_expert_intermediate_size:
            if tcfg.intermediate_size:
                out.append(("intermediate_size (down_proj in_features per rank)", tcfg.intermediate_size, tp))
        if h.shared_expert_intermediate_size:
            out.append(("shared_expert_intermediate_size (shared down_proj in_features per rank)",
                        h.shared_expert_intermediate_size, tp))
    return out


def experts_module(model_type: str) -> str:
    """Where a decoder layer keeps its routed experts (Gemma 4: beside its dense MLP, as `experts`)."""
    return "experts" if model_type in GEMMA4 else "mlp.experts"


def hybrid(tcfg) -> bool:
    return getattr(tcfg, "hybrid", None) is not None


def loader_class(model_type: str) -> str:
    """The transformers auto class a quantizing build loads the target with: wrappers keep their vision part, so
    the export keeps the release's layout (and TensorRT-LLM's multimodal classes find their weights)."""
    return "AutoModelForImageTextToText" if model_type in WRAPPERS else "AutoModelForCausalLM"
