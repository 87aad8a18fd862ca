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


def test_captured_features_are_layer_outputs(tiny_pairs):
    from transformers import AutoModelForCausalLM

    tdir, _ = tiny_pairs["qwen3"]
    tcfg = TargetConfig.from_dir(tdir)
    target, _ = load_models(ModelPaths(tdir, None), tcfg, None, torch.float32, "cpu")
    target.capture_ids = [0, 2, 2]  # concatenated in the config's order, duplicates kept (as the reference)
    seq = list(range(3, 40))
    _, _, feats = teacher_forward(target, [seq], capture=True, logits=False)
    hf = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32).eval()
    with torch.no_grad():
        hs = hf(torch.tensor([seq]), output_hidden_states=True).hidden_states
    ref = torch.cat([hs[0 + 1][0], hs[2 + 1][0], hs[2 + 1][0]], -1)
    assert torch.allclose(feats, ref, atol=1e-4, rtol=1e-4)
