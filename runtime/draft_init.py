"""A starting drafter for a target: the z-lab layout with shapes taken from the target, its draft layers
copied from the target's top layers (same shapes, a far better start than random weights), fc averaging
the captured layers. Used for the embedded default before training and as the trainer's initialisation."""
from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

from .checkpoint import load_state_dict
from .config import TargetConfig, default_target_layer_ids


def init_drafter_from_target(target_dir: str, out_dir: str, num_layers: int = 3, block_size: int = 16,
                             mask_token_id: int | None = None, target_layer_ids: list[int] | None = None,
                             dtype: torch.dtype = torch.float32) -> str:
    tcfg = TargetConfig.from_dir(target_dir)
    state = load_state_dict(target_dir, "target")
    L, H = tcfg.num_hidden_layers, tcfg.hidden_size
    ids = target_layer_ids or default_target_layer_ids(L, num_layers)
    if mask_token_id is None:
        mask_token_id = tcfg.vocab_size - 1
    w = {"fc.weight": torch.cat([torch.eye(H) / len(ids)] * len(ids), dim=1),
         "hidden_norm.weight": torch.ones(H), "norm.weight": state["model.norm.weight"].clone()}
    for i in range(num_layers):
        src = f"model.layers.{L - num_layers + i}."
        for name in ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                     "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            w[f"layers.{i}.{name}.weight"] = state[src + name + ".weight"].clone()
        for n in ("q_norm", "k_norm"):
            key = src + f"self_attn.{n}.weight"
            w[f"layers.{i}.self_attn.{n}.weight"] = state[key].clone() if key in state else torch.ones(tcfg.head_dim)
    cfg = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "hidden_size": H, "intermediate_size": tcfg.intermediate_size, "num_hidden_layers": num_layers,
        "num_attention_heads": tcfg.num_attention_heads, "num_key_value_heads": tcfg.num_key_value_heads,
        "head_dim": tcfg.head_dim, "rms_norm_eps": tcfg.rms_norm_eps, "rope_theta": tcfg.rope.theta,
        "max_position_embeddings": tcfg.max_position_embeddings, "vocab_size": tcfg.vocab_size,
        "num_target_layers": L, "block_size": block_size, "attention_bias": False, "hidden_act": "silu",
        "tie_word_embeddings": False, "torch_dtype": str(dtype).replace("torch.", ""),
        "dflash_config": {"mask_token_id": int(mask_token_id), "target_layer_ids": list(ids)},
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file({k: v.to(dtype).contiguous() for k, v in w.items()}, os.path.join(out_dir, "model.safetensors"))
    return out_dir
