"""DFlash2 drafters: our drafter against the z-lab reference (PyPI `dflash` 0.1.0: `DFlash2DraftModel`,
`GroupedDynamicCausalConv`, `CandidateSelector.select`) step by step, the engine's automatic choice of the DFlash2
proposer, greedy losslessness at every acceptance length, and exact target sampling with the selector's draft
distribution."""
import json
import math
import os
import time
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

import tiny
from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import CheckpointError
from dflash_trt.models.dflash2 import is_dflash2
from test_sampling import exact_second_token_dist

dflash_model = pytest.importorskip("dflash.model", reason="z-lab reference `dflash` not installed")


def make_dflash2(path, target_dir, *, kernel=2, group=16, rank=8, top_k=6, cb_std=0.25, seed=5, extra=None,
                 codebook_suffix="", **drafter_kw):
    """A random DFlash2 drafter in the z-lab layout: tiny.make_drafter's backbone plus per-layer attention / MLP
    convolutions (base_kernel [2, K, H], kernel_projection [2*K*H/group, H]) and the candidate selector
    (codebooks stored without `.weight`, as z-lab's checkpoints are)."""
    tiny.make_drafter(path, target_dir, **drafter_kw)
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    g = torch.Generator().manual_seed(seed)
    w = load_file(os.path.join(path, "model.safetensors"))
    for i in range(cfg["num_hidden_layers"]):
        for name in ("attention_conv", "mlp_conv"):
            base = torch.zeros(2, kernel, h)
            base[:, 0] = 1 + torch.randn(2, h, generator=g) * 0.1  # tap 0 near identity, earlier rows mixed in
            base[:, 1:] = torch.randn(2, kernel - 1, h, generator=g) * 0.3
            w[f"layers.{i}.{name}.base_kernel"] = base
            w[f"layers.{i}.{name}.kernel_projection.weight"] = torch.randn(2 * kernel * (h // group), h,
                                                                           generator=g) * 0.05
    for cb in ("predecessor_codebook", "successor_codebook"):
        w[f"candidate_selector.{cb}{codebook_suffix}"] = torch.randn(vocab, rank, generator=g) * cb_std
    w["candidate_selector.hidden_projection.weight"] = torch.randn(rank, h, generator=g) * 0.3
    cfg["architectures"] = ["DFlash2DraftModel"]
    cfg["auto_map"] = {"AutoModel": "dflash.DFlash2DraftModel"}
    cfg["dflash_config"] |= {"conv_kernel_size": kernel, "conv_group_size": group, "selector_rank": rank,
                             "selector_top_k": top_k}
    cfg |= extra or {}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    save_file({k: v.contiguous() for k, v in w.items()}, os.path.join(path, "model.safetensors"))
    return path


def make_pair(root, extra=None, kernel=2):
    t = tiny.make_target(str(root / "t"), kind="qwen3", head_dim=32, seed=8, boost_tokens=(11,), boost=5.0)
    d = make_dflash2(str(root / "d"), t, block_size=8, seed=3, std=0.15, mask_token_id=tiny.mask_proposing(t, 11),
                     residual_scale=0.3, extra=extra, kernel=kernel)
    return t, d


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_pair(tmp_path_factory.mktemp("dflash2"))


def run_reference(tdir, ddir, prompt, max_new):
    """The reference's own greedy loop (dflash_generate), recording every selector call: its inputs (draft rows'
    hidden states, logits, anchor) and its path."""
    from transformers import AutoModelForCausalLM

    dflash_model._cuda_time = time.perf_counter  # its timer assumes CUDA
    target = AutoModelForCausalLM.from_pretrained(tdir, dtype=torch.float32).eval()
    draft = dflash_model.DFlash2DraftModel.from_pretrained(ddir, dtype=torch.float32).eval()
    calls = []
    select = draft.candidate_selector.select

    def spy(hidden, logits, anchor_ids, temperature):
        path, cand, q = select(hidden, logits, anchor_ids, temperature)
        calls.append(dict(hidden=hidden[0].clone(), logits=logits[0].clone(), anchor=int(anchor_ids[0]),
                          path=path[0].tolist()))
        return path, cand, q

    draft.candidate_selector.select = spy
    out = dflash_model.dflash_generate(draft, target, torch.tensor([prompt]), max_new, None, 0.0,
                                       return_stats=True)
    return out.output_ids[0, len(prompt):].tolist(), calls, out.acceptance_lengths, draft


def our_first_block(t, d, prompt):
    """Our engine's draft rows' hidden states for the first block after the prompt (z-lab's `draft_hidden`)."""
    from dflash_trt.scheduler import Scheduled

    eng = LLM(target=t, draft=d, draft_len_policy="fixed", draft_weights="auto").engine  # the drafter as loaded
    b = eng.drafter.block_size
    seq = eng.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    eng.step()
    seen = {}
    orig = eng.drafter.selector_logits
    eng.drafter.selector_logits = lambda h, head: seen.setdefault("h", h) is not None and orig(h, head)
    eng.proposer.propose([Scheduled(seq, b, b - 1, False)])
    return eng, seen["h"]


def check_against_reference(t, d, prompt, max_new=40):
    ref_tokens, calls, ref_acc, ref_draft = run_reference(t, d, prompt, max_new)
    llm = LLM(target=t, draft=d, draft_len_policy="fixed", trace=True, draft_weights="auto")
    assert type(llm.engine.proposer).__name__ == "DFlash2Proposer"
    out = llm.generate([prompt], SamplingParams(max_tokens=max_new, ignore_eos=True))[0]
    assert out.token_ids == ref_tokens[:max_new]
    block = llm.engine.drafter.block_size
    full = [i for i, c in enumerate(calls)
            if len(c["path"]) == block - 1 and i < len(out.trace) and len(out.trace[i][0]) == block - 1]
    assert len(full) >= 3 and max(ref_acc) >= 2
    # the selector matters: its path is not the rows' argmax everywhere
    assert any(c["path"] != c["logits"].argmax(-1).tolist() for c in calls)
    for i in full:
        drafts, accepted = out.trace[i]
        assert drafts == calls[i]["path"], f"step {i}"
        assert accepted + 1 == ref_acc[i], f"step {i}"

    eng, hidden = our_first_block(t, d, prompt)
    assert torch.allclose(hidden, calls[0]["hidden"], atol=1e-4, rtol=1e-4)
    # selector scores, step by step: the reference's draft distribution at T = 1 (softmax of its scores along
    # the path it samples) against ours, scored along the same path
    sel = eng.drafter.candidate_selector
    for i in full[:4]:
        c = calls[i]
        torch.manual_seed(i)
        with torch.inference_mode():
            path, cand, q_ref = ref_draft.candidate_selector.select(c["hidden"][None], c["logits"][None],
                                                                    torch.tensor([c["anchor"]]), 1.0)
        unary, ours_cand, proj = sel.candidates(c["hidden"], c["logits"])
        prev = torch.tensor([c["anchor"]])
        for j in range(block - 1):
            q_ours = torch.softmax(sel.score(proj[j:j + 1], unary[j:j + 1], ours_cand[j:j + 1], prev)[0], -1)
            dense_ref = torch.zeros(c["logits"].shape[-1]).scatter(0, cand[0, j], q_ref[0, j].float())
            dense_ours = torch.zeros_like(dense_ref).scatter(0, ours_cand[j], q_ours)
            assert torch.allclose(dense_ours, dense_ref, atol=1e-5), f"step {i} row {j}"
            prev = path[0, j:j + 1]


def test_drafts_and_selector_scores_match_reference(pair):
    t, d = pair
    prompt = torch.randint(4, 128, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    check_against_reference(t, d, prompt)


def test_sliding_bidirectional_kernel3_matches_reference(tmp_path):
    """Published DFlash2 layouts: sliding_attention layers with `is_causal: false` (the window on both sides of
    a query, shorter here than the 30-token prompt) and a 3-tap convolution."""
    extra = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8,
             "use_sliding_window": True, "is_causal": False}
    t, d = make_pair(tmp_path, extra=extra, kernel=3)
    prompt = torch.randint(4, 128, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    check_against_reference(t, d, prompt, max_new=32)


def test_detection_and_config_errors(pair, tmp_path):
    t, d = pair
    assert is_dflash2(d)
    assert not is_dflash2(tiny.make_drafter(str(tmp_path / "v1"), t))
    assert not is_dflash2(str(tmp_path / "missing"))
    bad = tmp_path / "bad"
    make_dflash2(str(bad), t, block_size=8)
    with open(bad / "config.json") as f:
        cfg = json.load(f)
    del cfg["dflash_config"]["conv_kernel_size"]
    with open(bad / "config.json", "w") as f:
        json.dump(cfg, f)
    with pytest.raises(CheckpointError, match="conv_kernel_size"):
        LLM(target=t, draft=str(bad))
    # codebooks saved through transformers (nn.Embedding weights, `.weight` suffix) load the same
    suffixed = make_dflash2(str(tmp_path / "suffixed"), t, block_size=8, seed=3, std=0.15,
                            mask_token_id=tiny.mask_proposing(t, 11), residual_scale=0.3, codebook_suffix=".weight")
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    assert LLM(target=t, draft=suffixed).generate([[5, 6, 7]], sp)[0].token_ids == \
        LLM(target=t, draft=d).generate([[5, 6, 7]], sp)[0].token_ids


def prompts(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 128, (int(torch.randint(2, 30, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def test_greedy_equals_ar_at_every_acceptance_length(pair):
    t, d = pair
    ps = prompts(4, seed=4)
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    ar = [o.token_ids for o in LLM(target=t, speculative=False).generate(ps, sp)]
    accepted = 0
    for k in (2, 7):  # the selector's own drafts
        outs = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=k).generate(ps, sp)
        assert [o.token_ids for o in outs] == ar, f"K={k}"
        accepted += sum(o.accepted for o in outs)
    assert accepted > 0
    # the convolution stays inside each request's block: a request's drafts are the same alone as in the batch
    traced = LLM(target=t, draft=d, draft_len_policy="fixed", trace=True)
    together = traced.generate(ps, sp)
    assert traced.generate([ps[2]], sp)[0].trace == together[2].trace
    # the selector runs every step, then its drafts are replaced by the target's continuation cut at a chosen
    # place, so every acceptance length 0..K occurs through the DFlash2 engine
    k = 7
    eng = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=k, trace=True).engine
    seqs = [eng.add_request(p, SamplingParams(max_tokens=40, ignore_eos=True)) for p in ps]
    truth = {s.seq_id: a for s, a in zip(seqs, [o.token_ids for o in LLM(target=t, speculative=False).generate(
        ps, SamplingParams(max_tokens=40, ignore_eos=True))])}
    oracle, real = tiny.OracleDrafter(lambda s: truth[s.seq_id]), eng.proposer.propose

    def propose(work, want_confidence=False):
        out = real(work, want_confidence)
        out.drafts = oracle([w for w in work if w.draft_len > 0]) if out.drafts else {}
        return out

    eng.proposer.propose = propose
    while eng.has_unfinished():
        eng.step()
    lengths = set()
    for s in seqs:
        assert s.output_ids == truth[s.seq_id]
        lengths |= {acc for drafts, acc in s.trace if len(drafts) == k}
    assert lengths == set(range(k + 1)), sorted(lengths)
    assert eng.blocks.num_free == eng.blocks.num_blocks


def chi_square_ok(counts, exact, n):
    expected = exact * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    chi2 = (((obs - exp) ** 2)[keep] / exp[keep]).sum().item()
    dof = int(keep.sum()) - 1
    if dof == 0:  # one cell holds all the mass
        return bool((obs == exp)[keep].all()), f"one cell: {obs.tolist()} vs {exp.tolist()}"
    limit = dof * (1 - 2 / (9 * dof) + 3.09 * math.sqrt(2 / (9 * dof))) ** 3  # 99.9% (Wilson-Hilferty)
    return chi2 < limit, f"chi2 {chi2:.1f} vs {limit:.1f} (dof {dof})"


def rejection_outcomes(target_logits, q_cands, q_probs, params_of, n):
    """n seeded runs of one verify block: each draws its drafts from q with the proposer's DRAFT stream (the
    draft distribution does not depend on the earlier draft here), then the Verifier commits tokens."""
    from dflash_trt.spec import verify

    k, start = q_cands.shape[0], 40
    params = [params_of(i) for i in range(n)]
    u = verify.stream_uniforms(torch.tensor([sp.seed for sp in params]).repeat_interleave(k),
                               torch.arange(start + 1, start + k + 1).repeat(n), verify.DRAFT_STREAM).view(n, k)
    cdf = q_probs.cumsum(-1)
    picks = torch.stack([torch.searchsorted(cdf[j], (u[:, j] * cdf[j, -1]).contiguous(), right=True)
                         for j in range(k)], 1).clamp_max(q_cands.shape[1] - 1)
    items = []
    for i, sp in enumerate(params):
        items.append(verify.VerifyItem(sp, q_cands.gather(1, picks[i][:, None])[:, 0].tolist(), i * (k + 1),
                                       start, verify.DraftDist(q_cands, q_probs)))
    return verify.Verifier()(items, target_logits.repeat(n, 1))


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (4, 0.8)])
def test_rejection_sampling_keeps_the_target_distribution(top_k, top_p, monkeypatch):
    """The verifier alone: drafts drawn from a q far from p (and putting mass where top-k / top-p make p zero);
    the committed first token follows p, and a block accepted whole is followed by a bonus from the next row's
    p. Resampling a rejected row from p instead of max(p - q, 0) fails the same test."""
    from dflash_trt.sampling import filtered_probs

    g = torch.Generator().manual_seed(0)
    vocab, k, n = 12, 2, 1500
    logits = torch.randn(k + 1, vocab, generator=g) * 1.5
    # q: 6 candidates, the target's likelier tokens mostly, with weights of their own
    q_cands = torch.stack([torch.sort(logits[j] + torch.randn(vocab, generator=g), descending=True).indices[:6]
                           for j in range(k)])
    q_probs = torch.softmax(logits[:k].gather(1, q_cands).double() + torch.randn(k, 6, generator=g).double(), -1)

    def params_of(i):
        return SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, seed=10_000 + i)

    p = filtered_probs(logits, 0.8, top_k, top_p)
    outs = rejection_outcomes(logits, q_cands, q_probs, params_of, n)
    first = torch.bincount(torch.tensor([o[0] for o in outs]), minlength=vocab).double()
    assert first[p[0] == 0].sum() == 0
    ok, msg = chi_square_ok(first, p[0], n)
    assert ok, msg
    whole = [o for o in outs if len(o) == k + 1]
    assert len(whole) > 300  # blocks accepted whole: their bonus follows the last row's p
    ok, msg = chi_square_ok(torch.bincount(torch.tensor([o[-1] for o in whole]), minlength=vocab).double(), p[k],
                            len(whole))
    assert ok, msg
    if top_k:
        return
    from dflash_trt.spec import verify

    monkeypatch.setattr(verify, "residual", lambda p_row, cand, q: p_row)
    wrong = rejection_outcomes(logits, q_cands, q_probs, params_of, n)
    ok, msg = chi_square_ok(torch.bincount(torch.tensor([o[0] for o in wrong]), minlength=vocab).double(), p[0], n)
    assert not ok, "resampling rejected rows from p should be visibly biased: " + msg


def test_sampling_distribution_is_the_targets(pair):
    """End to end: the second sampled token (decided by rejection sampling of the selector's first draft) fits
    the exact target distribution (chi-square), drafts sampled from q get accepted, and a seeded request samples
    the same tokens alone as in a batch."""
    t, d = pair
    prompt, temp, top_k, top_p, n = [5, 6, 7, 8], 1.0, 8, 0.9, 500
    exact = exact_second_token_dist(t, prompt, temp, top_k, top_p)
    llm = LLM(target=t, draft=d, draft_len_policy="fixed", max_draft_len=2, max_batch_size=64, max_num_tokens=1024)
    sps = [SamplingParams(max_tokens=3, temperature=temp, top_k=top_k, top_p=top_p, seed=1000 + i,
                          ignore_eos=True) for i in range(n)]
    outs = llm.generate([prompt] * n, sps)
    assert sum(o.accepted for o in outs) > 50
    counts = torch.bincount(torch.tensor([o.token_ids[1] for o in outs]), minlength=exact.numel()).double()
    assert counts[exact == 0].sum() == 0, "sampled a token the target gives probability 0"
    ok, msg = chi_square_ok(counts, exact, n)
    assert ok, msg
    assert llm.generate([prompt], sps[7])[0].token_ids == outs[7].token_ids


def test_mixed_batch_verifies_each_item_over_its_own_rows():
    """Sampled DFlash2 items (rejection sampling) and ordinary items in one verification: each item's tokens are
    what it gets verified alone."""
    from dflash_trt.spec import verify

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(10, 12, generator=g) * 2
    dist = verify.DraftDist(torch.tensor([[3, 4, 5], [6, 7, 8]]), torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]],
                                                                                dtype=torch.float64))
    items = [verify.VerifyItem(SamplingParams(temperature=0.7, seed=3), [4, 8], 0, 20, dist),
             verify.VerifyItem(SamplingParams(temperature=0.7, seed=4), [2, 5], 3, 30),
             verify.VerifyItem(SamplingParams(), [int(logits[6].argmax()), 1, 2], 6, 10)]
    together = verify.Verifier()(items, logits)
    for it, toks in zip(items, together):
        n = len(it.drafts) + 1
        alone = verify.Verifier()([replace(it, offset=0)], logits[it.offset:it.offset + n])[0]
        assert toks == alone
    assert together[2][0] == int(logits[6].argmax())
