"""The screened greedy head (runtime/greedy_head.py): its tokens are the full head's argmax, bit for bit (ties to
the first index, bf16 rounding included), on the embedded target's real hidden states and on rows built to sit
on the bound's edges; and the engine's greedy output does not move when it screens."""
import pytest
import torch

import tiny
from dflash_trt import LLM, SamplingParams, ops
from dflash_trt.greedy_head import ARM_ROWS, GreedyHead
from dflash_trt.plugins import invariant as bi


@pytest.fixture(scope="module")
def smollm_rows():
    """Final-normed hidden rows of the embedded target (transformers' own forward) over the README, and its
    head."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash_trt.embedded import embedded_paths

    t, _ = embedded_paths()
    tok = AutoTokenizer.from_pretrained(t)
    m = AutoModelForCausalLM.from_pretrained(t, dtype=torch.bfloat16)
    with open(__file__.replace("tests/test_greedy_head.py", "README.md")) as f:
        ids = tok(f.read()[:4000], return_tensors="pt").input_ids[:, :320]
    with torch.no_grad():
        hidden = m(ids, output_hidden_states=True).hidden_states[-1][0]
    return hidden, m.lm_head.weight.detach()


def _armed(w, packed, x):
    gh = GreedyHead(w, packed)
    gh.observe(x[:ARM_ROWS])
    assert gh.armed
    return gh


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_screened_tokens_are_the_full_heads_argmax(invariant_kernels, smollm_rows, dtype):
    ops.enable_invariant(True)
    hidden, w = smollm_rows
    x, w = hidden.to(dtype), w.to(dtype)
    packed = ops.pack(w)
    gh = _armed(w, packed, x)
    full = bi.linear(x, packed).float().argmax(1)
    screened = 0
    for m in (1, 3, 4, 8, 40):  # 8, 40: verify blocks' rows, candidates from every row in one set of panels
        for i in range(ARM_ROWS, x.shape[0] - m, m):
            got = gh.tokens(x[i:i + m])
            if got is not None:
                screened += 1
                assert torch.equal(got, full[i:i + m]), (dtype, i, m)
    assert screened > 100  # the screen answered nearly every call (its outlier dimensions fit these rows)


def test_ties_rounding_and_bad_rows(invariant_kernels):
    ops.enable_invariant(True)
    g = torch.Generator().manual_seed(0)
    V, K = 4096, 128
    w = (torch.randn(V, K, generator=g) * 0.05).to(torch.bfloat16)
    w[2000] = w[1000]  # an exact tie: the first index wins
    w[3000] = w[1000]
    w[500] = w[1000]
    w[500, 7] = (w[1000, 7].float() * (1 + 2 ** -7)).to(torch.bfloat16)  # a hair apart: equal once bf16-rounded?
    packed = ops.pack(w)
    x = torch.randn(200, K, generator=g).to(torch.bfloat16)
    x[:, 3] *= 40  # an outlier dimension
    gh = _armed(w, packed, x)
    rows = x[ARM_ROWS:ARM_ROWS + 64].clone()
    # rows aimed at the tied tokens: x along their weight row
    rows[:32] = (w[1000].float() * 50 + torch.randn(32, K, generator=g)).to(torch.bfloat16)
    rows[40] = 0  # every logit 0: all 4,096 tie, too many candidates: the caller computes logits
    answered = 0
    for i in range(0, 64, 4):
        got = gh.tokens(rows[i:i + 4])
        if got is not None:
            answered += 1
            assert torch.equal(got, bi.linear(rows[i:i + 4], packed).float().argmax(1)), i
    assert answered == 15 and gh.tokens(rows[40:41]) is None
    assert bi.linear(rows[:32], packed).float().argmax(1).tolist() == [500] * 32 or 1000 in \
        bi.linear(rows[:32], packed).float().argmax(1).tolist()  # the rows do land on the tied tokens
    bad = rows[:2].clone()
    bad[1, 5] = float("nan")
    assert gh.tokens(bad) is None  # not finite: the caller computes logits
    huge = (rows[:4].float() * (3e38 / rows[:4].float().abs().max())).to(torch.bfloat16)
    assert torch.isfinite(huge).all() and gh.tokens(huge) is None  # finite, but its sums overflow: the caller's
    assert not GreedyHead.screens(bi.pack_linear_w8a8(w.float()))


def test_engine_output_is_the_same_with_and_without_the_screen(tmp_path, monkeypatch):
    t = tiny.make_target(str(tmp_path / "t"), hidden=128, vocab=512)
    d = tiny.make_drafter(str(tmp_path / "d"), t, block_size=4)
    prompts = [[11, 11, 5], [11, 4, 11, 6], [7, 11], [9, 9, 9, 9, 9]]
    sp = SamplingParams(max_tokens=48, ignore_eos=True)
    for dtype in ("float32", "bfloat16"):
        base = LLM(target=t, speculative=False, dtype=dtype)
        monkeypatch.setattr(GreedyHead, "tokens", lambda self, x: None)  # never screened
        ref = [o.token_ids for o in base.generate(prompts, sp)]
        monkeypatch.undo()
        for llm in (LLM(target=t, speculative=False, dtype=dtype), LLM(target=t, draft=d, dtype=dtype)):
            calls = []
            target = llm.engine.target
            orig = target.greedy_tokens
            target.greedy_tokens = lambda h: calls.append(orig(h)) or calls[-1]
            assert [o.token_ids for o in llm.generate(prompts, sp)] == ref, dtype
            assert sum(c is not None for c in calls) > 20, dtype  # the screen answered most steps


def _edge_case(dtype, q_top: dict, x_vals: dict):
    """A head of int8-exact rows (codes / 128, each row's largest code 127: the screen's weight codes miss
    nothing) and one x row whose chunks the W8A8 codes represent as `x_vals` says; the screen armed with
    dimensions 0-15 as its outliers. q_top: vocabulary row -> {dim: code} over a base row."""
    g = torch.Generator().manual_seed(1)
    V, K = 256, 128
    q = torch.randint(-3, 4, (V, K), generator=g).float()
    q[:, 127] = 127
    for row, codes in q_top.items():
        q[row] = 0
        q[row, 127] = 127
        for k, c in codes.items():
            q[row, k] = c
    w = (q / 128).to(dtype)
    packed = ops.pack(w)
    arm = torch.zeros(ARM_ROWS, K)
    arm[:, :16] = 1000
    gh = GreedyHead(w, packed)
    gh.observe(arm.to(dtype))
    assert gh.armed and gh.out_idx.tolist() == list(range(16))
    x = torch.zeros(1, K)
    for k, v in x_vals.items():
        x[0, k] = v
    return gh, packed, x.to(dtype)


def test_the_bound_covers_what_the_activation_codes_miss(invariant_kernels):
    # exact: C - D = (0.45 + 0.45 - 0.55) / 128 > 0; the codes of x (scale 1: 127 is the chunk's largest)
    # round 0.45 to 0 and 0.55 to 1, so the screen's estimate puts D 1/128 above C
    ops.enable_invariant(True)
    base = {40: 20}
    gh, packed, x = _edge_case(torch.float32, {30: {**base, 33: 1, 34: 1, 35: -1}, 40: base},
                               {40: 127.0, 33: 0.45, 34: 0.45, 35: 0.55})
    full = bi.linear(x, packed).float().argmax(1)
    assert full.item() == 30
    assert torch.equal(gh.tokens(x), full)


def test_the_bound_covers_what_bf16_logits_round_together(invariant_kernels):
    # A = 2560 / 128 = 20.0 and B = 2566 / 128 = 20.047 are one bf16 number: the full head's bf16 logits tie and
    # the first index wins, though the screen's estimate (exact here) puts B above A
    ops.enable_invariant(True)
    a = {40: 20, 41: 20}
    gh, packed, x = _edge_case(torch.bfloat16, {10: a, 20: {**a, 42: 6}}, {40: 127.0, 41: 1.0, 42: 1.0})
    logits = bi.linear(x, packed).float()
    assert logits[0, 10] == logits[0, 20] == logits.max() and logits.argmax(1).item() == 10
    assert gh.tokens(x).item() == 10


def test_fp32_panels_and_the_models_weight_left_as_it_was(invariant_kernels):
    # fp32 weights that are not bf16 numbers keep fp32 panels; arming must not touch the head (a tied head is
    # the embedding table)
    ops.enable_invariant(True)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(300, 64, generator=g) * 0.3
    before = w.clone()
    packed = ops.pack(w)
    assert packed.data.dtype == torch.float32
    arm = torch.randn(ARM_ROWS, 64, generator=g) * (1 + 5 * torch.rand(1, 64, generator=g))
    gh = _armed(w, packed, arm)
    assert torch.equal(w, before)
    answered = 0
    for i in range(400):
        x = torch.randn(1 + i % 4, 64, generator=g) * torch.rand(1, 1, generator=g) * 3
        got = gh.tokens(x)
        if got is not None:
            answered += 1
            assert torch.equal(got, bi.linear(x, packed).float().argmax(1)), i
    assert answered > 300


def test_bf16_panels_of_fp32_weights_round_their_candidates_rows(invariant_kernels):
    # `--weights bf16` on a float32 model: the head's panels hold its fp32 weights rounded to bf16; the screen
    # reads the candidates' rows from the fp32 weight itself (no bf16 copy of the head) and must round them alike
    ops.enable_invariant(True)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(700, 64, generator=g) * 0.3  # not bf16 numbers
    packed = bi.pack_linear(w, torch.bfloat16)
    assert packed.data.dtype == torch.bfloat16 and GreedyHead.screens(packed)
    gh = _armed(w, packed, torch.randn(ARM_ROWS, 64, generator=g))
    assert gh.rows.data_ptr() == w.data_ptr()  # the engine's head, not a copy
    answered = 0
    for i in range(300):
        x = torch.randn(1 + i % 8, 64, generator=g) * 2
        got = gh.tokens(x)
        if got is not None:
            answered += 1
            assert torch.equal(got, bi.linear(x, packed).float().argmax(1)), i
    assert answered > 200


@pytest.mark.parametrize("dtype,weights", [("float32", "auto"), ("bfloat16", "auto"), ("bfloat16", "w8a8")])
def test_greedy_tokens_are_the_logits_argmax_past_the_screen(tmp_path, dtype, weights):
    """Past the screen's rows, where it declines (not armed, a NaN row) and for heads it does not screen (8-bit
    panels), greedy_tokens is the packed head's argmax in one op: exactly logits().argmax(-1)."""
    t = tiny.make_target(str(tmp_path / "t"), hidden=128, vocab=512)
    target = LLM(target=t, speculative=False, dtype=dtype, weights=weights).engine.target
    g = torch.Generator().manual_seed(5)
    for m in (1, 4, 5, 8, 12, 33):
        h = (torch.randn(m, 128, generator=g) * 2).to(getattr(torch, dtype))
        if m == 5:
            h[2, 3] = float("nan")
        got = target.greedy_tokens(h)
        assert got is not None and torch.equal(got, target.logits(h).argmax(-1)), (dtype, weights, m)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_heads_multiplied_with_fp32_fmas_are_screened_at_any_rows(tmp_path, dtype):
    """An fp32 head's full pass is compute-bound from a few rows on, so its screen takes every call (a loaded batch's
    verify rows included); a bf16 k-pair head's only a few rows. Either way the tokens are the logits' argmax."""
    t = tiny.make_target(str(tmp_path / "t"), hidden=128, vocab=512)
    target = LLM(target=t, speculative=False, dtype=dtype).engine.target
    g = torch.Generator().manual_seed(3)
    gh = target.prepare_greedy_head()
    gh.observe((torch.randn(ARM_ROWS, 128, generator=g) * 2).to(getattr(torch, dtype)))
    assert gh.armed
    calls = []
    screen = gh.tokens
    gh.tokens = lambda x: calls.append(x.shape[0]) or screen(x)
    for m in (1, 8, 9, 33):
        h = (torch.randn(m, 128, generator=g) * 2).to(getattr(torch, dtype))
        got = target.greedy_tokens(h)
        assert got is not None and torch.equal(got, target.logits(h).argmax(-1)), (dtype, m)
    pairs = target.head_packed.data.dtype == torch.int16
    assert calls == ([1, 8] if pairs else [1, 8, 9, 33]), (dtype, target.head_packed.data.dtype)
