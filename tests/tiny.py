"""Tiny random checkpoints built on the fly: transformers targets and z-lab-format drafters."""
from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

VOCAB = 128


def make_target(path: str, kind: str = "llama", *, layers: int = 4, hidden: int = 64, heads: int = 4,
                kv_heads: int = 2, vocab: int = VOCAB, tied: bool = False, rope_scaling: dict | None = None,
                seed: int = 0, init_std: float = 0.2, head_dim: int | None = None,
                boost_tokens: tuple[int, ...] = (), boost: float = 4.0) -> str:
    """Random weights with a large init so logits are peaked (no fp near-ties in greedy tests).

    boost_tokens: lm_head rows scaled up so a few tokens dominate; a random drafter (which shares the head)
    then agrees with the target often enough to exercise multi-token acceptance.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=2048,
                  tie_word_embeddings=tied, initializer_range=init_std, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0)
    if head_dim:
        common["head_dim"] = head_dim
    if kind == "llama":
        rope = {"rope_type": "default", "rope_theta": 10000.0}
        if rope_scaling:
            rope = {"rope_theta": 500000.0, **rope_scaling}
        cfg = LlamaConfig(**common, rope_parameters=rope)
        model = LlamaForCausalLM(cfg)
    elif kind == "qwen3":
        cfg = Qwen3Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
        model = Qwen3ForCausalLM(cfg)
    else:
        raise ValueError(kind)
    with torch.no_grad():  # un-flatten the norms too so every weight matters
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(torch.randn_like(p) * 0.1)
        if boost_tokens:
            head = model.get_output_embeddings().weight
            head[list(boost_tokens)] *= boost
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(path)
    add_tokenizer(path, vocab)
    return path


CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant: {% endif %}")


def add_tokenizer(path: str, vocab: int = VOCAB) -> None:
    """A character-level tokenizer (printable ASCII) with a chat template, saved beside the weights."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<mask>"]
    chars = [chr(c) for c in range(32, 127)]
    table = {t: i for i, t in enumerate(specials + chars)}
    table |= {f"<unused{i}>": i for i in range(len(table), vocab)}
    tk = Tokenizer(models.WordLevel(table, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   mask_token="<mask>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)


def make_drafter(path: str, target_dir: str, *, layers: int = 2, block_size: int = 8, mask_token_id: int = 3,
                 target_layer_ids: list[int] | None = None, seed: int = 1, std: float = 0.2,
                 layout: str = "nested", heads: int = 4, kv_heads: int = 2, head_dim: int | None = None,
                 extra: dict | None = None, residual_scale: float = 1.0) -> str:
    """A random drafter in the z-lab format. layout: where block_size / mask / ids live in config.json.

    residual_scale < 1 shrinks o_proj/down_proj so rows stay close to their input embedding: the drafter
    then mostly proposes the head's favourite token for the mask embedding (see proposal_for_mask).
    """
    with open(os.path.join(target_dir, "config.json")) as f:
        t = json.load(f)
    h, n_t = t["hidden_size"], t["num_hidden_layers"]
    hd = head_dim or h // heads
    ids = target_layer_ids if target_layer_ids is not None else sorted({1, n_t - 2})
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g) * std

    w = {"fc.weight": rnd(h, h * len(ids)), "hidden_norm.weight": 1 + rnd(h) * 0.5, "norm.weight": 1 + rnd(h) * 0.5}
    inter = 2 * h
    for i in range(layers):
        p = f"layers.{i}."
        w |= {p + "input_layernorm.weight": 1 + rnd(h) * 0.5, p + "post_attention_layernorm.weight": 1 + rnd(h) * 0.5,
              p + "self_attn.q_proj.weight": rnd(heads * hd, h), p + "self_attn.k_proj.weight": rnd(kv_heads * hd, h),
              p + "self_attn.v_proj.weight": rnd(kv_heads * hd, h), p + "self_attn.o_proj.weight": rnd(h, heads * hd),
              p + "self_attn.q_norm.weight": 1 + rnd(hd) * 0.5, p + "self_attn.k_norm.weight": 1 + rnd(hd) * 0.5,
              p + "mlp.gate_proj.weight": rnd(inter, h), p + "mlp.up_proj.weight": rnd(inter, h),
              p + "mlp.down_proj.weight": rnd(h, inter)}
        w[p + "self_attn.o_proj.weight"] *= residual_scale
        w[p + "mlp.down_proj.weight"] *= residual_scale
    cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
           "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "hidden_size": h, "intermediate_size": inter,
           "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
           "head_dim": hd, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048,
           "vocab_size": t["vocab_size"], "num_target_layers": n_t, "attention_bias": False,
           "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32"}
    if layout == "nested":
        cfg |= {"block_size": block_size, "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": ids}}
    elif layout == "top":
        cfg |= {"block_size": block_size, "mask_token_id": mask_token_id, "target_layer_ids": ids}
    elif layout == "all_nested":
        cfg |= {"dflash_config": {"block_size": block_size, "mask_token_id": mask_token_id, "target_layer_ids": ids}}
    elif layout == "default_ids":  # no ids anywhere: the default rule must pick them
        cfg |= {"block_size": block_size, "dflash_config": {"mask_token_id": mask_token_id}}
    cfg |= extra or {}
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file({k: v.contiguous() for k, v in w.items()}, os.path.join(path, "model.safetensors"))
    return path


def mask_proposing(target_dir: str, wanted: int) -> int:
    """A mask token id whose embedding, through the target head, prefers `wanted` (used with residual_scale)."""
    from safetensors.torch import load_file

    w = load_file(os.path.join(target_dir, "model.safetensors"))
    emb = w["model.embed_tokens.weight"]
    head = w.get("lm_head.weight", emb)
    normed = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + 1e-6)
    fav = (normed @ head.T).argmax(-1)
    hits = (fav == wanted).nonzero().flatten().tolist()
    hits = [i for i in hits if i != wanted] or hits
    if not hits:
        raise ValueError(f"no token's embedding prefers {wanted}")
    return hits[0]


def edit_json(path: str, **changes) -> None:
    """Set (or, with None, remove) top-level keys of a JSON file: how tests break configs."""
    with open(path) as f:
        cfg = json.load(f)
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    with open(path, "w") as f:
        json.dump(cfg, f)


def accepting_pair(root: str, block_size: int = 8, **target_kw) -> tuple[str, str]:
    """A Llama target whose head favours token 11 and a drafter whose mask proposes it: drafts get accepted
    often enough to exercise multi-token acceptance."""
    t = make_target(os.path.join(root, "t"), **{"kind": "llama", "boost_tokens": (11,), "boost": 5.0, **target_kw})
    d = make_drafter(os.path.join(root, "d"), t, block_size=block_size, mask_token_id=mask_proposing(t, 11),
                     residual_scale=0.3)
    return t, d


def as_propose(drafts_of):
    """A proposer's `propose` from a function of the drafting work items -> {seq_id: drafts} (test oracles)."""
    from dflash_trt.spec.interface import Proposal

    def propose(work, want_confidence=False):
        work = [w for w in work if w.draft_len > 0]
        return Proposal(drafts_of(work) if work else {})
    return propose


class OracleDrafter:
    """Proposes the target's own continuation, corrupted at a chosen position each step, so every
    acceptance length 0..K occurs."""

    def __init__(self, truth):
        self.truth, self.step = truth, 0  # truth(seq): the target's own output for that request

    def __call__(self, work):
        out = {}
        for w in work:
            s = w.seq
            n = len(s.token_ids)
            full = s.prompt_ids + self.truth(s)
            drafts = full[n:n + w.draft_len]
            drafts += [5] * (w.draft_len - len(drafts))
            cut = self.step % (w.draft_len + 1)  # accepted length this step, if the truth is long enough
            if cut < len(drafts):
                drafts[cut] = (drafts[cut] + 1) % VOCAB
            out[s.seq_id] = drafts
            self.step += 1
        return out
