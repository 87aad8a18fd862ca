"""model_type -> target model class. Dense Llama/Qwen3 use target.py; the other families their own module."""
from __future__ import annotations

from ..config import TargetConfig
from .target import TargetModel


def target_class(model_type: str):
    from ..config import HYBRID_TARGETS

    if model_type in HYBRID_TARGETS:
        from .qwen3_5 import HybridModel
        return HybridModel
    if model_type == "qwen3_moe":
        from .qwen3_moe import Qwen3MoeModel
        return Qwen3MoeModel
    if model_type == "gpt_oss":
        from .gpt_oss import GptOssModel
        return GptOssModel
    if model_type == "gemma3_text":
        from .gemma3 import Gemma3Model
        return Gemma3Model
    if model_type == "deepseek_v3":
        from .deepseek_v3 import DeepseekV3Model
        return DeepseekV3Model
    if model_type in ("gemma4", "gemma4_text"):
        from .gemma4 import Gemma4Model
        return Gemma4Model
    if model_type == "kimi_k25":
        from .deepseek_v3 import KimiK25Model
        return KimiK25Model
    if model_type == "minimax_m2":
        from .minimax_m2 import MiniMaxM2Model
        return MiniMaxM2Model
    return TargetModel


def build_target(cfg: TargetConfig, max_positions: int = 4096) -> TargetModel:
    # a hybrid's model code reads its own HybridConfig (models/qwen3_5.py)
    return target_class(cfg.model_type)(cfg.hybrid if cfg.hybrid is not None else cfg, max_positions)
