"""int8 weight panels (W8A16) and the `weights` load option: the int8 kernel is bitwise the W8A16 contract (the
fp32 kernel's chains over the codes, each chunk scaled once; every SIMD path, any batch) and within fp32
rounding of the dequantised weight, and an engine loaded with weights="int8" decodes greedy DFlash
token for token as its own AR, from a quarter of the target's weight bytes."""
import pytest
import torch

import tiny
import w8a16
from dflash_trt import LLM, SamplingParams
from dflash_trt.errors import DFlashError
from dflash_trt.plugins import invariant as bi


pytestmark = pytest.mark.usefixtures("invariant_kernels")


def _deq(w):
    q, s = bi.quantize_int8(w)
    return q.float() * s[:, None]


def test_quantize_int8_is_per_row_symmetric_round_to_nearest():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(40, 70, generator=g) * torch.rand(40, 1, generator=g) * 5
    w[7] = 0  # an all-zero row
    q, s = bi.quantize_int8(w)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (40,)
    assert torch.equal(s, w.abs().amax(1) / 127) and int(q.abs().max()) == 127 and not q[7].any()
    nz = torch.arange(40) != 7
    assert torch.equal(q[nz].abs().amax(1), torch.full((39,), 127, dtype=torch.int8))  # the row max maps to 127
    err = (q.float() * s[:, None] - w).abs()
    assert bool((err <= s[:, None] * 0.5 * (1 + 1e-5) + 1e-12).all())  # nearest code


@pytest.mark.parametrize("isa", ["avx512", "avx2", "scalar"])
def test_int8_panels_are_bitwise_the_w8a16_contract_and_close_to_the_dequantised_weight(isa):
    if bi.set_isa(isa) != isa:
        pytest.skip(f"{isa} not available on this CPU")
    g = torch.Generator().manual_seed(0)
    for n, k in [(37, 64), (96, 576), (5, 9), (64, 40)]:
        w = torch.randn(n, k, generator=g) * 3
        w[0, :4] = torch.tensor([-1e3, 1e3, 0.0, -0.0])  # codes -127 and 127 (and 0) in the first row
        q, s = bi.quantize_int8(w)
        p32, p8 = bi.pack_linear(_deq(w)), bi.pack_linear_int8(w)
        assert p8.data.dtype == torch.int8 and p8.data.numel() == p32.data.numel()  # 1 byte, not 4
        assert p8.nbytes() == p8.data.numel() + 4 * p8.data.shape[0] * 32
        for m in (1, 3, 8, 17):
            x = torch.randn(m, k, generator=g)
            bias = torch.randn(n, generator=g)
            for ks in (1, 2) if k % 2 == 0 else (1,):
                y = bi.linear(x, p8, bias, ks)
                assert torch.equal(y, w8a16.reference(x, q.float(), s, bias, ks)), (isa, n, k, m, ks)
                w8a16.assert_close(y, bi.linear(x, p32, bias, ks), x, _deq(w))
            xb = x.to(torch.bfloat16)
            assert torch.equal(bi.linear(xb, p8), w8a16.reference(xb, q.float(), s))
        if k % 8 == 0:  # tensor-parallel partial sums of the chunks too
            x = torch.randn(4, k, generator=g)
            assert torch.equal(bi.linear_partial(x, p8, 2, 4, 8),
                               w8a16.reference(x, q.float(), s, k_splits=8, chunks=range(2, 4)))
    bi.set_isa("auto")


@pytest.mark.parametrize("pack", ["pack_linear_int8", "pack_linear_w8a8"])
def test_int8_rows_are_batch_and_thread_invariant(pack):
    """W8A16 and W8A8 (whose activation scales come from each row alone): a row's result is the same alone, in
    any batch, at any position, beside rows of far larger range, at any thread count."""
    k, n = 576, 1536
    g = torch.Generator().manual_seed(1)
    pk = getattr(bi, pack)(torch.randn(n, k, generator=g))
    b = torch.randn(n, generator=g)
    x = torch.randn(40, k, generator=g) * torch.rand(40, 1, generator=g) * 3  # rows of different ranges
    torch.set_num_threads(1)
    full = bi.linear(x, pk, b)
    torch.set_num_threads(2)
    assert torch.equal(bi.linear(x, pk, b), full)
    for m in (1, 2, 3, 5, 8, 12, 13, 16, 17, 25, 39):
        assert torch.equal(bi.linear(x[:m], pk, b), full[:m]), m
    row = x[9:10]
    for pos in (0, 4, 13):  # one row at several positions among unrelated rows
        batch = torch.cat([x[20:20 + pos], row, x[20:30] * 50])
        assert torch.equal(bi.linear(batch, pk, b)[pos:pos + 1], full[9:10]), pos


def test_int8_scale_is_required():
    p8 = bi.pack_linear_int8(torch.randn(32, 16))
    with pytest.raises(RuntimeError, match="int8 packed weight needs its float32"):
        torch.ops.dflash_trt.bi_linear(torch.randn(1, 16), p8.data, 32, None, 1, None)


# ---- the engine option --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny.accepting_pair(str(tmp_path_factory.mktemp("int8")))


@pytest.mark.parametrize("mode,dtype", [("int8", torch.int8), ("w8a8", torch.int32)])
def test_int8_engine_dflash_equals_its_ar(pair, mode, dtype):
    t, d = pair
    prompts = [[4, 5, 6], [11, 7, 9, 10], [30] * 12]
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    spec = LLM(target=t, draft=d, draft_len_policy="fixed", weights=mode)
    target = spec.engine.target
    lin = target.model.layers[0].mlp.down_proj
    assert lin.packed.dtype == dtype and lin.weight.numel() == 0  # only the 8-bit panels remain
    assert target.head_packed.dtype == dtype  # the (tied) head too
    layer = target.model.layers[0]
    assert layer.self_attn.qkv.packed.dtype == dtype and layer.mlp.gate_up.packed.dtype == dtype
    assert layer.fusable  # the fused projections and the one-op layer run on the int8 panels
    assert spec.engine.drafter.layers[0].mlp.down_proj.packed.dtype == dtype  # the drafter follows `weights`
    # but W8A8 leaves its fc (the target's raw hidden states in, outliers and all) as the checkpoint's panels
    assert spec.engine.drafter.fc.packed.dtype == (torch.float32 if mode == "w8a8" else dtype)
    out = spec.generate(prompts, sp)  # three requests batched
    alone = [spec.generate([p], sp)[0] for p in prompts]
    ar = LLM(target=t, speculative=False, weights=mode).generate(prompts, sp)
    kept = LLM(target=t, draft=d, draft_len_policy="fixed", weights=mode, draft_weights="auto")
    assert kept.engine.drafter.layers[0].mlp.down_proj.packed.dtype == torch.float32  # the drafter as it was
    own = kept.generate(prompts, sp)
    assert [o.token_ids for o in out] == [o.token_ids for o in ar] == [o.token_ids for o in alone] == \
        [o.token_ids for o in own]
    assert sum(o.accepted for o in out) > 0
    # the default (adaptive) policy calibrates its step costs on the 8-bit drafter too
    adaptive = LLM(target=t, draft=d, weights=mode)
    assert [o.token_ids for o in adaptive.generate(prompts, sp)] == [o.token_ids for o in ar]
    # the int8 target is the fp32 target with its weights rounded: close logits, not the same ones
    from dflash_trt.teacher import teacher_forward
    seq = [[4, 5, 6, 7, 8, 9, 10, 11]]
    fp32 = LLM(target=t, speculative=False)
    l8, l32 = teacher_forward(target, seq)[1], teacher_forward(fp32.engine.target, seq)[1]
    assert 0 < (l8 - l32).abs().max() < 0.05 * l32.abs().max()


def test_a_target_kept_as_loaded_drafts_in_w8a8_where_integer_dots_run(pair, monkeypatch):
    from dflash_trt import int8_weights

    t, d = pair
    for vnni in (True, False):
        monkeypatch.setattr(bi, "int8_dots_pay", lambda: vnni)
        assert int8_weights.draft_weights_for("auto", None) == ("w8a8" if vnni else "auto")
        drafter = LLM(target=t, draft=d, max_batch_size=1).engine.drafter
        assert drafter.layers[0].mlp.down_proj.packed.dtype == (torch.int32 if vnni else torch.float32)
    # anything said wins: the target's weights, then draft_weights
    assert int8_weights.draft_weights_for("int8", None) == "int8"
    assert int8_weights.draft_weights_for("auto", "auto") == "auto"
    assert int8_weights.draft_weights_for("bf16", "fp8") == "fp8"


def test_bf16_and_fp8_weights_pack_their_panels(pair):
    t, _ = pair
    for mode, dtype in (("bf16", torch.bfloat16), ("fp8", torch.uint8)):
        target = LLM(target=t, speculative=False, weights=mode).engine.target
        assert target.model.layers[1].self_attn.q_proj.packed.dtype == dtype, mode
        assert target.head_packed.dtype == dtype, mode


def test_bf16_weights_of_a_bf16_model_keep_its_panels(pair):
    """weights="bf16" on a model run in bf16 repacks nothing into slower panels: the same panels as "auto"
    (bf16 k-pairs where vdpbf16ps pays, widened bf16 elsewhere) and the same tokens."""
    t, _ = pair
    engines = {m: LLM(target=t, speculative=False, dtype="bfloat16", weights=m) for m in ("auto", "bf16")}
    packs = {m: [mod.packed for mod in e.engine.target.modules() if getattr(mod, "packed", None) is not None]
             + [e.engine.target.head_packed] for m, e in engines.items()}
    assert [p.dtype for p in packs["bf16"]] == [p.dtype for p in packs["auto"]]
    assert all(torch.equal(a.data, b.data) for a, b in zip(packs["bf16"], packs["auto"]))
    expect = torch.int16 if bi.bf16_pairs_pay() else torch.bfloat16
    assert packs["bf16"][0].dtype == expect
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    outs = {m: [o.token_ids for o in e.generate([[5, 6, 7, 8]], sp)] for m, e in engines.items()}
    assert outs["bf16"] == outs["auto"]


def test_bad_weights_are_one_line_errors(pair, capsys):
    from dflash_trt.cli.generate import main as generate

    t, _ = pair
    assert generate(["--target", t, "--no-spec", "--weights", "int4", "--prompt", "hi", "--max-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "error: weights (--weights) must be one of auto, bf16, int8, w8a8, fp8, got 'int4'\n"
    with pytest.raises(DFlashError, match="invariant_kernels on"):
        LLM(target=t, speculative=False, weights="int8", invariant_kernels=False)
