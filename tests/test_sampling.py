"""Sampling: Philox known answers, seeded determinism, and lossless DFlash sampling (distribution test)."""
import math

import pytest
import torch

import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.sampling import filtered_probs, philox4x32, sample_rows


def test_philox_known_answers():  # Random123 kat_vectors for philox4x32_10
    c = torch.tensor([[0, 0, 0, 0], [0xFFFFFFFF] * 4, [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344]])
    k = torch.tensor([[0, 0], [0xFFFFFFFF] * 2, [0xA4093822, 0x299F31D0]])
    assert philox4x32(c, k).tolist() == [[0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8],
                                         [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD],
                                         [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]]


def test_filtered_probs_top_k_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    p = filtered_probs(logits, 1.0, 2, 1.0)[0]
    assert (p[2:] == 0).all() and abs(p.sum().item() - 1) < 1e-12
    full = torch.softmax(logits.double(), -1)[0]
    p = filtered_probs(logits, 1.0, 0, 0.7)[0]  # keeps the smallest prefix whose mass reaches 0.7
    keep = int((full.cumsum(0) - full < 0.7).sum())
    assert (p[:keep] > 0).all() and (p[keep:] == 0).all()


def test_sampler_follows_distribution():
    logits = torch.tensor([[1.0, 0.5, 0.0, -1.0]]).repeat(20000, 1)
    sp = SamplingParams(temperature=1.0, seed=123)
    toks = sample_rows(logits, [sp] * 20000, list(range(20000)))
    freq = torch.bincount(toks, minlength=4).double() / 20000
    assert torch.allclose(freq, torch.softmax(logits[0].double(), 0), atol=0.015)


PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("samp")
    t = tiny.make_target(str(root / "t"), kind="llama")
    d = tiny.make_drafter(str(root / "d"), t, block_size=8)
    return t, d


def propose_always(llm, token):
    """Replace the drafter's proposals by one fixed token (the target's mode): acceptance becomes frequent
    at T > 0, so a biased acceptance rule would visibly skew the distribution."""
    llm.engine.proposer.propose = tiny.as_propose(lambda work: {w.seq.seq_id: [token] * w.draft_len for w in work})
    return llm


def test_seeded_sampling_identical_to_ar_and_batch_independent(pair):
    t, d = pair
    prompts = [PROMPT] * 8 + [[9, 10, 11, 12, 13], [20]]
    sps = [SamplingParams(max_tokens=30, temperature=0.5, top_k=k, top_p=p, seed=s, ignore_eos=True)
           for k, p, s in [(0, 1.0, 1), (20, 0.9, 2), (5, 1.0, 3), (0, 1.0, 4), (0, 1.0, 5), (0, 1.0, 6),
                           (0, 0.8, 7), (3, 1.0, 8), (0, 1.0, 9), (0, 1.0, 10)]]
    ar = [o.token_ids for o in LLM(target=t, speculative=False).generate(prompts, sps)]
    mode = int(exact_second_token_dist(t, PROMPT, 0.5, 0, 1.0).argmax())
    llm = propose_always(LLM(target=t, draft=d, draft_len_policy="fixed"), mode)
    spec = llm.generate(prompts, sps)
    assert [o.token_ids for o in spec] == ar
    assert sum(o.accepted for o in spec) > 0
    alone = llm.generate([prompts[8]], sps[8])[0].token_ids
    assert alone == ar[8]


def exact_second_token_dist(tdir, prompt, temperature, top_k, top_p):
    """P(token at step 2) = sum_t1 P(t1) P(t2 | t1), from transformers (an independent implementation)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float64).eval()
    with torch.no_grad():
        p1 = filtered_probs(hf(torch.tensor([prompt])).logits[0, -1:], temperature, top_k, top_p)[0]
        support = p1.nonzero().flatten().tolist()
        batch = torch.tensor([prompt + [t1] for t1 in support])
        p2 = filtered_probs(hf(batch).logits[:, -1], temperature, top_k, top_p)
    return (p1[support][:, None] * p2).sum(0)


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (8, 0.9)])
def test_dflash_sampling_distribution_is_the_targets(pair, top_k, top_p):
    """Chi-square goodness of fit of DFlash's second sampled token against the exact target distribution."""
    t, d = pair
    prompt, temp, n = PROMPT, 0.5, 1500
    exact = exact_second_token_dist(t, prompt, temp, top_k, top_p)
    llm = propose_always(LLM(target=t, draft=d, draft_len_policy="fixed", max_batch_size=64, max_num_tokens=1024), int(exact.argmax()))
    sps = [SamplingParams(max_tokens=3, temperature=temp, top_k=top_k, top_p=top_p, seed=1000 + i,
                          ignore_eos=True) for i in range(n)]
    outs = llm.generate([prompt] * n, sps)
    assert sum(o.accepted for o in outs) > 50  # drafts were accepted: the test exercises acceptance
    counts = torch.bincount(torch.tensor([o.token_ids[1] for o in outs]), minlength=exact.numel()).double()
    assert counts[exact == 0].sum() == 0, "sampled a token the target gives probability 0"
    expected = exact * n
    big = expected >= 5  # pool the tail so every chi-square cell has enough mass
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    chi2 = (((obs - exp) ** 2)[keep] / exp[keep]).sum().item()
    dof = int(keep.sum()) - 1
    # 99.9% quantile via the Wilson-Hilferty approximation
    z = 3.09
    limit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < limit, f"chi2 {chi2:.1f} >= {limit:.1f} (dof {dof})"
