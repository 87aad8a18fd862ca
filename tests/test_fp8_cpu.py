"""FP8 targets on CPU keep their weights in FP8: the e4m3 kernel is bitwise the W8A16 contract (the fp32 kernel's
chains over the codes' values, each chunk scaled once; every SIMD path) and within fp32 rounding of the
dequantised weight, and an FP8 engine decodes losslessly from a quarter of the weight bytes, its logits those
of the dequantised target to fp32 rounding."""
import importlib.util

import pytest
import torch

import tiny
import w8a16
from dflash_trt import LLM, SamplingParams
from dflash_trt.builder.cli import main as build_main
from dflash_trt.plugins import invariant as bi


@pytest.fixture(scope="module", autouse=True)
def kernels():
    bi.load()
    yield
    bi.set_isa("auto")


@pytest.mark.parametrize("isa", ["avx512", "avx2", "scalar"])
def test_fp8_panels_are_bitwise_the_w8a16_contract_and_close_to_the_dequantised_weight(isa):
    if bi.set_isa(isa) != isa:
        pytest.skip(f"{isa} not available on this CPU")
    g = torch.Generator().manual_seed(0)
    for n, k in [(37, 64), (96, 576), (5, 9), (64, 40)]:
        w = (torch.randn(n, k, generator=g) * 3).to(torch.float8_e4m3fn)
        # zeros of both signs, the smallest subnormals and the largest finite codes
        w.view(torch.uint8)[0, :8] = torch.tensor([0, 1, 7, 8, 0x80, 0x81, 0x7E, 0xFE], dtype=torch.uint8)
        for scale in (torch.tensor(0.0137), torch.rand(n, generator=g) + 0.01):
            deq = w.float() * (scale if scale.numel() == 1 else scale[:, None])
            p32, p8 = bi.pack_linear(deq), bi.pack_linear_fp8(w, scale)
            assert p8.data.dtype == torch.uint8 and p8.data.numel() == p32.data.numel()  # 1 byte, not 4
            values, col_scale = w.float() / 256, scale.expand(n) * 256  # both exact
            for m in (1, 3, 8, 17):
                x = torch.randn(m, k, generator=g)
                bias = torch.randn(n, generator=g)
                for ks in (1, 2) if k % 2 == 0 else (1,):
                    y = bi.linear(x, p8, bias, ks)
                    assert torch.equal(y, w8a16.reference(x, values, col_scale, bias, ks)), (isa, n, k, m, ks)
                    w8a16.assert_close(y, bi.linear(x, p32, bias, ks), x, deq)
            if k % 8 == 0:  # tensor-parallel partial sums of the chunks too
                x = torch.randn(4, k, generator=g)
                assert torch.equal(bi.linear_partial(x, p8, 2, 4, 8),
                                   w8a16.reference(x, values, col_scale, k_splits=8, chunks=range(2, 4)))


def test_fp8_scale_is_required():
    w = torch.randn(32, 16).to(torch.float8_e4m3fn)
    p8 = bi.pack_linear_fp8(w, torch.tensor(1.0))
    with pytest.raises(RuntimeError, match="scale"):
        torch.ops.dflash_trt.bi_linear(torch.randn(1, 16), p8.data, 32, None, 1, None)


NEEDS_MODELOPT = pytest.mark.skipif(importlib.util.find_spec("modelopt") is None, reason="needs nvidia-modelopt")


@pytest.fixture(scope="module")
def fp8_engine(tmp_path_factory):
    """A tiny accepting pair built by dflash-build --quantization fp8 (ModelOpt): the engine directory."""
    root = tmp_path_factory.mktemp("fp8")
    t, d = tiny.accepting_pair(str(root))
    engine = str(root / "fp8")
    assert build_main(["--target", t, "--draft", d, "--quantization", "fp8", "--calib-samples", "4",
                       "--output", engine, "--quiet"]) == 0
    return engine


@NEEDS_MODELOPT
def test_fp8_engine_keeps_fp8_weights_decodes_losslessly_and_matches_the_dequantised_logits(fp8_engine):
    engine = fp8_engine
    kept = LLM(engine, draft_len_policy="fixed")
    deq = LLM(engine, draft_len_policy="fixed", fp8_weights=False)
    layers = tiny_layers = kept.engine.target_config.num_hidden_layers
    assert kept.engine.fp8_linears == 7 * tiny_layers and deq.engine.fp8_linears == 0
    lin = kept.engine.target.model.layers[0].mlp.down_proj
    assert lin.packed.data.dtype == torch.uint8 and lin.weight.numel() == 0
    assert kept.engine.weight_bytes < deq.engine.weight_bytes
    prompts = [[4, 5, 6], [11, 7, 9, 10], [30] * 12]
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    a = kept.generate(prompts, sp)
    assert sum(o.accepted for o in a) > 0
    # teacher-forced logits against the dequantised target: the same weights, summed in another order
    from dflash_trt.teacher import teacher_forward
    seq = [[4, 5, 6, 7, 8, 9, 10, 11]]
    lk, ld = teacher_forward(kept.engine.target, seq)[1], teacher_forward(deq.engine.target, seq)[1]
    torch.testing.assert_close(lk, ld, rtol=1e-4, atol=1e-4 * float(ld.abs().max()))
    assert torch.equal(lk.argmax(-1), ld.argmax(-1))
    ar = LLM(engine, speculative=False).generate(prompts, sp)
    assert [o.token_ids for o in ar] == [o.token_ids for o in a]  # lossless on the kept-FP8 path
    assert layers == len(kept.engine.target.model.layers)


def test_bf16_valued_fp32_weights_are_packed_as_bf16_with_the_same_bits():
    from dflash_trt import ops
    assert ops.enable_invariant()
    g = torch.Generator().manual_seed(1)
    w = torch.randn(70, 96, generator=g).bfloat16().float()  # a bf16 checkpoint loaded in fp32
    p = ops.pack(w)
    assert p.dtype == torch.bfloat16
    x = torch.randn(5, 96, generator=g)
    assert torch.equal(bi.linear(x, p), bi.linear(x, bi.pack_linear(w, torch.float32)))
    w[3, 4] += 1e-3  # one value bf16 cannot hold: fp32 panels
    assert ops.pack(w).dtype == torch.float32


def test_bf16_weights_get_k_pair_panels_only_where_vdpbf16ps_pays():
    from dflash_trt import ops
    assert ops.enable_invariant()
    w = torch.randn(70, 96, generator=torch.Generator().manual_seed(3)).bfloat16()  # a model run in bf16
    p = ops.pack(w)
    assert p.data.dtype == (torch.int16 if bi.bf16_pairs_pay() else torch.bfloat16)
    x = torch.randn(5, 96).bfloat16()
    torch.testing.assert_close(bi.linear(x, p).float(), x.float() @ w.float().T, rtol=2e-2, atol=2e-2)


def test_native_fp8_gemm_quantises_activations_per_row_or_statically():
    from dflash_trt import ops
    g = torch.Generator().manual_seed(2)
    n, k = 48, 64
    w = (torch.randn(n, k, generator=g) * 2).to(torch.float8_e4m3fn)
    for w_scale in (torch.tensor(0.02), torch.rand(n, generator=g) * 0.05 + 0.01):
        ws = w_scale.reshape(1, -1) if w_scale.numel() > 1 else w_scale
        x = torch.randn(5, k, generator=g)
        bias = torch.randn(n, generator=g)
        # static input scale: x / s rounded to e4m3, exact products summed in fp32, then both scales
        s = torch.tensor(0.01)
        xq = (x / s).clamp(-448, 448).to(torch.float8_e4m3fn).float()
        ref = xq @ w.float().t() * s * ws + bias
        assert torch.allclose(ops.fp8_linear(x, w, w_scale, s, bias), ref, rtol=1e-5, atol=1e-4)
        # no input scale: each row its own amax scale, so a row's result never depends on the batch
        y = ops.fp8_linear(x, w, w_scale, None)
        for i in range(x.shape[0]):
            assert torch.equal(ops.fp8_linear(x[i:i + 1], w, w_scale, None), y[i:i + 1])
        deq = x @ (w.float() * ws.reshape(-1, 1) if w_scale.numel() > 1 else w.float() * w_scale).t()
        assert (y - deq).abs().max() < 0.08 * deq.abs().max()  # e4m3 activations: a few % of the range
    assert ops.fp8_linear(torch.randn(2, 3, k), w, torch.tensor(1.0), None).shape == (2, 3, n)


@NEEDS_MODELOPT
def test_fp8_engine_with_native_fp8_gemms_is_lossless_and_close_to_the_dequantised_target(fp8_engine):
    engine = fp8_engine
    native = LLM(engine, draft_len_policy="fixed", fp8_compute=True)
    layers = native.engine.target_config.num_hidden_layers
    assert native.engine.fp8_native and native.engine.fp8_linears == 7 * layers
    lin = native.engine.target.model.layers[0].mlp.down_proj
    assert lin.fp8[0].dtype == torch.float8_e4m3fn and lin.fp8[2] is not None and lin.weight.numel() == 0
    assert LLM(engine, speculative=False).engine.fp8_native is False  # CPU default: the bitwise e4m3 panels
    prompts = [[4, 5, 6], [11, 7, 9, 10], [30] * 12]
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    out = native.generate(prompts, sp)
    ar = LLM(engine, speculative=False, fp8_compute=True).generate(prompts, sp)
    assert [o.token_ids for o in out] == [o.token_ids for o in ar]  # lossless on the native FP8 path too
    assert sum(o.accepted for o in out) > 0
    # teacher-forced logits against the dequantised (weight-only) target: within e4m3 activation error
    from dflash_trt.teacher import teacher_forward
    seq = [[4, 5, 6, 7, 8, 9, 10, 11]]
    ln = teacher_forward(native.engine.target, seq)[1]
    deq = LLM(engine, speculative=False, fp8_weights=False)
    ld = teacher_forward(deq.engine.target, seq)[1]
    assert (ln - ld).abs().max() < 0.1 * ld.abs().max()
    assert (ln.argmax(-1) == ld.argmax(-1)).float().mean() >= 0.75


def test_fp8_matmul_needs_fp8_tensor_cores(monkeypatch):
    """Native FP8 GEMMs by default only on CUDA devices of compute capability 8.9 (Ada) and up."""
    from dflash_trt import ops

    assert ops.fp8_matmul_available("cpu") is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for cap, want in (((8, 0), False), ((8, 6), False), ((8, 9), True), ((9, 0), True), ((10, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, cap=cap: cap)
        assert ops.fp8_matmul_available("cuda") is want, cap
        assert ops.fp8_matmul_available("cuda:0") is want, cap
        assert ops.fp8_matmul_available("cpu") is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CUDA build on a machine without a GPU
    assert ops.fp8_matmul_available("cuda") is False


@NEEDS_MODELOPT
def test_engine_asks_fp8_matmul_available_for_its_device(fp8_engine, monkeypatch):
    """Without fp8_compute the engine's choice is fp8_matmul_available(device): True -> native GEMMs."""
    from dflash_trt import ops

    asked = []
    monkeypatch.setattr(ops, "fp8_matmul_available", lambda device: asked.append(str(device)) or True)
    eng = LLM(fp8_engine, speculative=False).engine
    assert asked == ["cpu"] and eng.fp8_native and eng.fp8_linears == 7 * eng.target_config.num_hidden_layers


@NEEDS_MODELOPT
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fp8_engine_on_cuda(fp8_engine):
    """On a GPU with FP8 tensor cores the engine runs native FP8 GEMMs by default (else dequantised weights), and
    DFlash gives the same tokens as the same engine's AR path."""
    from dflash_trt import ops

    native = ops.fp8_matmul_available("cuda")
    spec = LLM(fp8_engine, device="cuda", draft_len_policy="fixed")
    assert spec.engine.fp8_native is native and (spec.engine.fp8_linears > 0) is native
    prompts = [[4, 5, 6], [11, 7, 9, 10], [30] * 12]
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    out = spec.generate(prompts, sp)
    ar = LLM(fp8_engine, device="cuda", speculative=False).generate(prompts, sp)
    assert [o.token_ids for o in out] == [o.token_ids for o in ar]
    assert sum(o.drafted for o in out) > 0
