"""Our compact model code against transformers on the same checkpoints (teacher-forced logits)."""
import pytest
import torch

from dflash_trt.config import TargetConfig
from dflash_trt.loader import ModelPaths, load_models
from dflash_trt.teacher import teacher_forward


@pytest.mark.parametrize("name", ["llama", "llama_tied_rope", "qwen3"])
def test_target_logits_match_transformers(tiny_pairs, name):
    from transformers import AutoModelForCausalLM

    tdir, _ = tiny_pairs[name]
    tcfg = TargetConfig.from_dir(tdir)
    target, _ = load_models(ModelPaths(tdir, None), tcfg, None, torch.float32, "cpu")
    hf = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, tcfg.vocab_size, (n,), generator=g).tolist() for n in (1, 7, 150)]
    _, logits, _ = teacher_forward(target, seqs)
    at = 0
    for s in seqs:
        with torch.no_grad():
            ref = hf(torch.tensor([s])).logits[0].float()
        ours = logits[at:at + len(s)]
        at += len(s)
        rel = ((ours - ref).abs().max() / ref.abs().max()).item()
        assert rel < 1e-4, f"{name}: relative logit error {rel}"


FAMILIES = {"qwen3_moe": "qwen3_moe", "gpt_oss": "gpt_oss", "gemma3": "gemma3", "deepseek_v3": "deepseek_v3"}


@pytest.fixture(scope="module")
def capture_targets(tiny_pairs, tmp_path_factory):
    """One tiny checkpoint per target family (the family tests' own builders), built on first use."""
    import importlib

    root, made = tmp_path_factory.mktemp("capture"), {"qwen3": tiny_pairs["qwen3"][0]}

    def get(name):
        if name not in made:
            builder = getattr(importlib.import_module(f"test_families_{FAMILIES[name]}"), name)
            made[name] = builder(str(root / name))
        return made[name]
    return get


@pytest.mark.parametrize("name", ["qwen3", *FAMILIES])
def test_captured_features_are_layer_outputs(capture_targets, name):
    """The drafter's context features are what the z-lab reference reads: transformers' hidden_states[id + 1],
    concatenated in the config's order, duplicates kept. For the last layer that entry is AFTER the final norm
    (transformers replaces it with the normed output), so our capture of layer L-1 is normed too."""
    from transformers import AutoModelForCausalLM

    tdir = capture_targets(name)
    tcfg = TargetConfig.from_dir(tdir)
    last = tcfg.num_hidden_layers - 1
    target, _ = load_models(ModelPaths(tdir, None), tcfg, None, torch.float32, "cpu")
    target.capture_ids = [0, 2, 2, last]
    seq = list(range(3, 40))  # longer than the gpt-oss / Gemma windows (8)
    _, _, feats = teacher_forward(target, [seq], capture=True, logits=False)
    hf = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32).eval()
    with torch.no_grad():
        hs = hf(torch.tensor([seq]), output_hidden_states=True).hidden_states
    assert len(hs) == last + 2
    parts = feats.split(tcfg.hidden_size, -1)
    for got, i in zip(parts, target.capture_ids):
        ref = hs[i + 1][0]
        rel = ((got - ref).abs().max() / ref.abs().max()).item()
        assert rel < 1e-4, f"{name}: captured layer {i} differs from hidden_states[{i + 1}] by {rel:.2e}"
