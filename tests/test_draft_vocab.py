"""A drafter's draft_vocab.json restricts proposals to its tokens; output stays the target's."""
import json
import shutil
import subprocess
import sys

import pytest
import torch

import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.draft_vocab import save_draft_vocab


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("dv")
    return (root, *tiny.accepting_pair(str(root)))


def with_vocab(root, d, name, ids):
    dst = root / name
    shutil.copytree(d, dst, dirs_exist_ok=True)
    save_draft_vocab(str(dst), torch.tensor(sorted(ids)))
    return str(dst)


PROMPTS = [[4, 5, 6], [7, 8, 9, 10, 11], [30, 31], [12] * 9, [40, 50, 60, 70]]
SP = SamplingParams(max_tokens=30, ignore_eos=True)


def test_full_vocab_file_drafts_exactly_as_without(pair):
    root, t, d = pair
    full = with_vocab(root, d, "full", range(tiny.VOCAB))
    # the drafter as loaded: an 8-bit drafter packs its draft-vocabulary head, but never the target's
    a = LLM(target=t, draft=d, trace=True, draft_len_policy="fixed", draft_weights="auto").generate(PROMPTS, SP)
    b = LLM(target=t, draft=full, trace=True, draft_len_policy="fixed", draft_weights="auto").generate(PROMPTS, SP)
    assert [o.trace for o in a] == [o.trace for o in b]
    assert sum(o.accepted for o in a) > 0


def test_subset_vocab_only_proposes_its_tokens_and_stays_lossless(pair):
    root, t, d = pair
    ar = [o.token_ids for o in LLM(target=t, speculative=False).generate(PROMPTS, SP)]
    full = LLM(target=t, draft=d, trace=True, draft_len_policy="fixed").generate(PROMPTS, SP)
    proposed = {x for o in full for drafts, _ in o.trace for x in drafts}
    assert 11 in proposed
    keep = set(range(0, tiny.VOCAB, 2)) | {11}  # drop every odd token but the frequent one
    sub = LLM(target=t, draft=with_vocab(root, d, "half", keep), trace=True,
              draft_len_policy="fixed").generate(PROMPTS, SP)
    drafted = {x for o in sub for drafts, _ in o.trace for x in drafts}
    assert drafted <= keep and drafted & keep
    assert any(x % 2 for x in proposed - {11}), "the full head proposed odd tokens the subset now excludes"
    assert [o.token_ids for o in sub] == ar
    assert [o.token_ids for o in full] == ar
    off = LLM(target=t, draft=with_vocab(root, d, "half", keep), trace=True, draft_vocab=False,
              draft_len_policy="fixed").generate(PROMPTS, SP)
    assert [o.trace for o in off] == [o.trace for o in full]  # draft_vocab=False ignores the file


@pytest.mark.parametrize("content, what", [
    ({"token_ids": [5, 3]}, "sorted"), ({"token_ids": [1, 10 ** 6]}, "vocabulary size"),
    ({"token_ids": []}, "non-empty"), ({"ids": [1]}, "unreadable"), ("not json", "unreadable")])
def test_bad_draft_vocab_is_one_line_error(pair, content, what):
    root, t, d = pair
    bad = root / "bad"
    shutil.copytree(d, bad, dirs_exist_ok=True)
    (bad / "draft_vocab.json").write_text(content if isinstance(content, str) else json.dumps(content))
    r = subprocess.run([sys.executable, "-m", "dflash_trt.cli.generate", "--target", t, "--draft", str(bad),
                        "--prompt", "ab", "--max-tokens", "2"], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "draft_vocab.json" in r.stderr and what in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_draft_confidence_is_the_drafters_probability_of_its_token(pair, softcap):
    """draft_tokens(confidence=True): each row's token is the argmax and its confidence the softmax probability
    of that token, over the draft vocabulary when there is one and over the whole head otherwise (what the
    confidence cut compares with its threshold)."""
    root, t, d = pair
    sub = with_vocab(root, d, "conf_sub", range(3, tiny.VOCAB, 2))
    g = torch.Generator().manual_seed(7)
    for draft in (d, sub):
        eng = LLM(target=t, draft=draft, draft_len_policy="fixed", draft_weights="auto").engine
        dr, head = eng.proposer.drafter, eng.target.logits
        dr.cfg.final_logit_softcapping = softcap
        hidden = torch.randn(6, dr.cfg.hidden_size, generator=g) * 3
        toks, conf = dr.draft_tokens(hidden, head, confidence=True)
        if dr.vocab_ids is None:
            logits, ids = dr.logits(hidden, head), torch.arange(tiny.VOCAB)
        else:
            logits, ids = dr._softcap(hidden @ dr.vocab_head.float().T * dr.cfg.output_multiplier), dr.vocab_ids
        p = torch.softmax(logits.double(), -1)
        assert torch.equal(toks, ids[p.argmax(-1)])
        assert torch.allclose(conf.double(), p.max(-1).values, rtol=1e-4, atol=1e-6)
        assert torch.equal(dr.draft_tokens(hidden, head), toks)
