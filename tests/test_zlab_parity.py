"""Our drafter against the z-lab reference (PyPI `dflash` 0.1.0, a test oracle only): same draft tokens and
acceptance lengths step by step, and draft logits within tolerance, on the same random checkpoints."""
import time

import pytest
import torch

dflash_model = pytest.importorskip("dflash.model", reason="z-lab reference `dflash` not installed")

import tiny  # noqa: E402
from dflash_trt import LLM, SamplingParams  # noqa: E402
from dflash_trt.config import DraftConfig  # noqa: E402


def run_reference(tdir, ddir, prompt, max_new):
    from transformers import AutoModelForCausalLM

    dflash_model._cuda_time = time.perf_counter  # its timer assumes CUDA
    target = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32).eval()
    draft = dflash_model.DFlashDraftModel.from_pretrained(ddir, dtype=torch.float32).eval()
    steps = []
    orig = draft.compute_logits

    def spy(hidden, head):
        logits = orig(hidden, head)
        steps.append(logits[0].clone())
        return logits

    draft.compute_logits = spy
    out = dflash_model.dflash_generate(draft, target, torch.tensor([prompt]), max_new, None, 0.0,
                                       return_stats=True)
    return out.output_ids[0, len(prompt):].tolist(), steps, out.acceptance_lengths


def compare_with_reference(root, block_size, prompt_len, extra=None, target_layer_ids=None, seed=None):
    """A random Qwen3 target and drafter checked against the reference (check_against_reference); returns (our
    first-step draft logits, the target, the drafter, the prompt)."""
    t = tiny.make_target(str(root / "t"), kind="qwen3", head_dim=32, seed=seed or block_size,
                          boost_tokens=(11,), boost=5.0)
    mask = tiny.mask_proposing(t, 11)  # the drafter leans to the target's favourite token: real acceptance
    d = tiny.make_drafter(str(root / "d"), t, block_size=block_size, seed=prompt_len, std=0.15,
                          mask_token_id=mask, residual_scale=0.3, extra=extra, target_layer_ids=target_layer_ids)
    g = torch.Generator().manual_seed(prompt_len)
    prompt = torch.randint(4, 128, (prompt_len,), generator=g).tolist()
    return check_against_reference(t, d, prompt), t, d, prompt


def check_against_reference(t, d, prompt, max_new=48):
    """Our engine and the reference on the same target / drafter directories: same tokens, same drafts and
    acceptance lengths at every full-block step, first-step draft logits within 1e-3. Returns our logits."""
    block_size = DraftConfig.from_dir(d).block_size
    ref_tokens, ref_logits, ref_acc = run_reference(t, d, prompt, max_new)

    llm = LLM(target=t, draft=d, draft_len_policy="fixed", trace=True, draft_weights="auto")
    out = llm.generate([prompt], SamplingParams(max_tokens=max_new, ignore_eos=True))[0]
    assert out.token_ids == ref_tokens[:max_new]
    # near max_tokens both sides shorten the block differently: compare the full-block steps
    full = [i for i, lg in enumerate(ref_logits)
            if lg.shape[0] == block_size - 1 and i < len(out.trace) and len(out.trace[i][0]) == block_size - 1]
    assert len(full) >= 3
    assert max(ref_acc) >= 2, "the pair never accepted a draft: the test would not exercise context appends"
    for i in full:
        drafts, accepted = out.trace[i]
        ref_drafts = ref_logits[i].argmax(-1).tolist()
        assert drafts == ref_drafts, f"step {i}"
        assert accepted + 1 == ref_acc[i], f"step {i}"

    ours = first_draft_logits(t, d, prompt)
    assert torch.allclose(ours, ref_logits[0].float(), atol=1e-3, rtol=1e-3)
    return ours


def first_draft_logits(t, d, prompt):
    """Our drafter's logits for the first block after the prompt's prefill."""
    from dflash_trt.scheduler import Scheduled

    eng = LLM(target=t, draft=d, draft_len_policy="fixed", draft_weights="auto").engine
    block_size = eng.drafter.block_size
    seq = eng.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    eng.step()  # prefill: context cache filled, first token sampled
    captured = {}
    orig = eng.drafter.logits
    eng.drafter.logits = lambda h, w: captured.setdefault("l", orig(h, w))
    eng.proposer.propose([Scheduled(seq, block_size, block_size - 1, False)])  # writes the prompt's context first
    return captured["l"].float()


@pytest.mark.parametrize("block_size,prompt_len", [(8, 5), (10, 30), (16, 70), (16, 12)])
def test_drafts_and_acceptance_match_reference(tmp_path, block_size, prompt_len):
    compare_with_reference(tmp_path, block_size, prompt_len)


WINDOW = 8
YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 64, "rope_theta": 150000.0}  # 64 x 32 = max_position_embeddings


def test_yarn_and_sliding_window_drafter_matches_reference(tmp_path):
    """The gpt-oss drafter's variants: YaRN RoPE from the draft config and a sliding_attention layer (window 8,
    shorter than the 30-token prompt), block size 8. The context also reads the target's LAST layer (id 3 of 4),
    which the reference takes after the final norm."""
    import shutil

    extra = {"rope_parameters": YARN, "layer_types": ["sliding_attention", "full_attention"],
             "sliding_window": WINDOW, "use_sliding_window": True, "max_position_embeddings": 2048}
    ours, t, d, prompt = compare_with_reference(tmp_path, 8, 30, extra=extra, target_layer_ids=[1, 3], seed=3)
    # each variant matters: the same weights without YaRN, or without the window, draft other logits
    for drop in (("rope_parameters",), ("layer_types", "sliding_window", "use_sliding_window")):
        other = tmp_path / ("no_" + drop[0])
        shutil.copytree(d, other)
        tiny.edit_json(str(other / "config.json"), **dict.fromkeys(drop))
        assert (first_draft_logits(t, str(other), prompt) - ours).abs().max() > 0.1, drop
