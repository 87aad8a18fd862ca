"""Our drafter against the z-lab reference (PyPI `dflash` 0.1.0, a test oracle only): same draft tokens and
acceptance lengths step by step, and draft logits within tolerance, on the same random checkpoints."""
import time

import pytest
import torch

dflash_model = pytest.importorskip("dflash.model", reason="z-lab reference `dflash` not installed")

import tiny  # noqa: E402
from dflash_trt import LLM, SamplingParams  # noqa: E402


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


@pytest.mark.parametrize("block_size,prompt_len", [(8, 5), (10, 30), (16, 70), (16, 12)])
def test_drafts_and_acceptance_match_reference(tmp_path, block_size, prompt_len):
    t = tiny.make_target(str(tmp_path / "t"), kind="qwen3", head_dim=32, seed=block_size,
                          boost_tokens=(11,), boost=5.0)
    mask = tiny.mask_proposing(t, 11)  # the drafter leans to the target's favourite token: real acceptance
    d = tiny.make_drafter(str(tmp_path / "d"), t, block_size=block_size, seed=prompt_len, std=0.15,
                          mask_token_id=mask, residual_scale=0.3)
    g = torch.Generator().manual_seed(prompt_len)
    prompt = torch.randint(4, 128, (prompt_len,), generator=g).tolist()
    max_new = 48
    ref_tokens, ref_logits, ref_acc = run_reference(t, d, prompt, max_new)

    llm = LLM(target=t, draft=d, draft_len_policy="fixed", trace=True)
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

    # logits: recompute our drafter's logits for the first step and compare numerically
    llm2 = LLM(target=t, draft=d, draft_len_policy="fixed")
    eng = llm2.engine
    seq = eng.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    eng.step()  # prefill: context cache filled, first token sampled
    from dflash_trt.scheduler import Scheduled
    captured = {}
    orig = eng.drafter.logits
    eng.drafter.logits = lambda h, w: captured.setdefault("l", orig(h, w))
    eng.runner.write_context([seq])  # the prompt's drafter context (written lazily, before a draft)
    eng.runner.draft([Scheduled(seq, block_size, block_size - 1, False)])
    assert torch.allclose(captured["l"], ref_logits[0].float(), atol=1e-3, rtol=1e-3)
