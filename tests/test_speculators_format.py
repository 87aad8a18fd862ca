"""Drafters in vLLM's speculators format (`speculators_model_type: dflash`) load as z-lab's do: a tiny z-lab
drafter converted into that layout here gives the same drafts, token for token, with the full vocabulary and with
a pruned one (d2t / t2d) against the z-lab drafter restricted to the same tokens by draft_vocab.json.

The layout, as speculators 0.9.0's own DFlashConverter writes it (run once on a drafter like these: z-lab
target_layer_ids [0, 2] became aux_hidden_state_layer_ids [1, 3], and our runtime gave that output the z-lab
drafter's drafts): the draft layers' Qwen3 config nested as transformer_layer_config (to_diff_dict: fields at
Qwen3Config's defaults may be omitted), block_size / mask_token_id / draft_vocab_size at top level, taps as transformers
hidden_states indices, the body's weights under z-lab's names beside embed_tokens / lm_head (the verifier's rows at
the draft vocabulary) and the d2t / t2d buffers."""
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.config import DraftConfig
from dflash_trt.draft_vocab import save_draft_vocab
from dflash_trt.errors import CheckpointError

ZLAB_ONLY = ("architectures", "auto_map", "block_size", "dflash_config", "num_target_layers")


def to_speculators(zlab: str, target: str, out: str, vocab: torch.Tensor | None = None) -> str:
    """The z-lab drafter `zlab` in the speculators layout; vocab: the sorted target ids of a pruned draft vocabulary."""
    from transformers import Qwen3Config

    with open(os.path.join(zlab, "config.json")) as f:
        z = json.load(f)
    # to_diff_dict's intent, made explicit (transformers 5's dataclass configs write every field): a field at
    # Qwen3Config's default is left out, so the reader must fill it in from the class
    full = Qwen3Config(**{k: v for k, v in z.items() if k not in ZLAB_ONLY + ("model_type",)}).to_dict()
    defaults = Qwen3Config().to_dict()
    layer = {k: v for k, v in full.items() if k == "model_type" or k not in defaults or defaults[k] != v}
    t = load_file(os.path.join(target, "model.safetensors"))
    emb = t["model.embed_tokens.weight"]
    head = t.get("lm_head.weight", emb)
    n = head.shape[0] if vocab is None else vocab.numel()
    cfg = {"architectures": ["DFlashDraftModel"], "speculators_model_type": "dflash", "speculators_version": "0.9.0",
           "transformer_layer_config": layer, "draft_vocab_size": n, "block_size": z["block_size"],
           "aux_hidden_state_layer_ids": [i + 1 for i in z["dflash_config"]["target_layer_ids"]],
           "mask_token_id": z["dflash_config"]["mask_token_id"], "target_hidden_size": None,
           "sample_from_anchor": False, "sliding_window_non_causal": False,
           "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy",
                                                        "speculative_tokens": z["block_size"] - 1}],
                                  "verifier": {"name_or_path": target, "architectures": ["Qwen3ForCausalLM"]}}}
    w = load_file(os.path.join(zlab, "model.safetensors")) | {"embed_tokens.weight": emb}
    if vocab is None:
        w["lm_head.weight"] = head
    else:
        t2d = torch.zeros(head.shape[0], dtype=torch.bool)
        t2d[vocab] = True
        w |= {"lm_head.weight": head[vocab], "d2t": vocab - torch.arange(n), "t2d": t2d}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    save_file({k: v.contiguous() for k, v in w.items()}, os.path.join(out, "model.safetensors"))
    return out


# 0 and 2: the first layer's output is hidden_states[1], the index speculators must record; a reader that took the
# ids as 0-based layers (or forgot the shift) would tap layers 1 and 3 and draft differently
IDS = [0, 2]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("speculators")
    t, _ = tiny.accepting_pair(str(root), layers=4)
    z = tiny.make_drafter(str(root / "z"), t, block_size=8, mask_token_id=tiny.mask_proposing(t, 11),
                          residual_scale=0.3, target_layer_ids=IDS)
    return t, z, root


def traces(t, d, ps, **kw):
    llm = LLM(target=t, draft=d, max_draft_len=7, draft_len_policy="fixed", trace=True, **kw)
    outs = llm.generate(ps, SamplingParams(max_tokens=24, ignore_eos=True))
    return [(o.token_ids, o.trace) for o in outs]


def test_config_reads_the_nested_layout(pair):
    t, z, root = pair
    s = to_speculators(z, t, str(root / "s_cfg"))
    with open(os.path.join(s, "config.json")) as f:
        raw = json.load(f)
    assert "rms_norm_eps" not in raw["transformer_layer_config"]  # Qwen3Config's default: filled in by the class
    got, want = DraftConfig.from_dir(s), DraftConfig.from_dir(z)
    for f in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "rms_norm_eps", "rope", "block_size", "mask_token_id", "target_layer_ids", "vocab_size"):
        assert getattr(got, f) == getattr(want, f), f
    assert got.target_layer_ids == IDS and raw["aux_hidden_state_layer_ids"] == [1, 3]


def test_same_drafts_as_the_zlab_drafter(pair):
    t, z, root = pair
    s = to_speculators(z, t, str(root / "s_full"))
    ps = tiny_prompts(8, seed=1)
    ref = traces(t, z, ps)
    assert traces(t, s, ps) == ref
    assert sum(a for _, tr in ref for _, a in tr) > 0  # drafts were accepted: the comparison covers multi-token steps


def test_pruned_vocab_drafts_as_zlab_with_the_same_draft_vocab(pair, tmp_path):
    t, z, root = pair
    vocab = torch.tensor(sorted({11} | set(range(3, tiny.VOCAB, 3))))
    s = to_speculators(z, t, str(root / "s_pruned"), vocab)
    zv = tmp_path / "z_vocab"
    shutil.copytree(z, zv)
    save_draft_vocab(str(zv), vocab)
    ps = tiny_prompts(8, seed=2)
    got = traces(t, s, ps)
    assert got == traces(t, str(zv), ps)
    drafted = {x for _, tr in got for dr, _ in tr for x in dr}
    assert drafted <= set(vocab.tolist())
    # the maps really prune: the same drafter over the full vocabulary drafts tokens outside it
    full = {x for _, tr in traces(t, s, ps, draft_vocab=False) for dr, _ in tr for x in dr}
    assert full - set(vocab.tolist())


def tiny_prompts(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, tiny.VOCAB, (int(torch.randint(2, 30, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def edit(src, dst, **change):
    shutil.copytree(src, dst)
    tiny.edit_json(os.path.join(dst, "config.json"), **change)
    return str(dst)


@pytest.mark.parametrize("change,msg", [
    (dict(speculators_model_type="eagle3"), "speculators 'eagle3' checkpoint: only speculators_model_type dflash"),
    (dict(sample_from_anchor=True), "unsupported speculators dflash sample_from_anchor"),
    (dict(sliding_window_non_causal=True), "unsupported speculators dflash sliding_window_non_causal"),
    (dict(aux_hidden_state_layer_ids=[0, 3]), "include 0, the embedding output"),
    (dict(aux_hidden_state_layer_ids=None), "has no aux_hidden_state_layer_ids"),
    (dict(target_hidden_size=32), "unsupported speculators dflash target_hidden_size 32"),
    (dict(transformer_layer_config=None), "has no transformer_layer_config"),
])
def test_bad_configs_fail_clearly(pair, tmp_path, change, msg):
    t, z, root = pair
    s = edit(to_speculators(z, t, str(tmp_path / "s")), tmp_path / "bad", **change)
    with pytest.raises(CheckpointError, match=msg) as e:
        DraftConfig.from_dir(s)
    assert "\n" not in str(e.value)


def test_taps_beyond_the_target_fail_clearly(pair, tmp_path):
    """aux id L (the last layer's output, hidden_states[L]) is valid; L + 1 names no layer."""
    from dflash_trt.errors import PairError

    t, z, root = pair
    s = edit(to_speculators(z, t, str(tmp_path / "s")), tmp_path / "bad", aux_hidden_state_layer_ids=[1, 5])
    with pytest.raises(PairError, match=r"target_layer_ids \[4\] out of range"):
        LLM(target=t, draft=s)


@pytest.mark.parametrize("corrupt,msg", [
    (lambda w: w.pop("d2t"), "the weights have no d2t map"),
    (lambda w: w.__setitem__("d2t", w["d2t"].flip(0)), "the maps are corrupt"),
    (lambda w: w.__setitem__("t2d", ~w["t2d"]), "the maps are corrupt"),
])
def test_bad_vocab_maps_fail_clearly(pair, tmp_path, corrupt, msg):
    t, z, root = pair
    s = to_speculators(z, t, str(tmp_path / "s"), torch.tensor([3, 5, 11, 40]))
    w = load_file(os.path.join(s, "model.safetensors"))
    corrupt(w)
    save_file(w, os.path.join(s, "model.safetensors"))
    with pytest.raises(CheckpointError, match=msg) as e:
        LLM(target=t, draft=s)
    assert "\n" not in str(e.value)
