"""dflash_trt.quantized: reading ModelOpt FP8 / NVFP4 exports, checked against ModelOpt's own dequantisation."""
import json
import os

import pytest
import torch

import tiny
from dflash_trt.errors import CheckpointError
from dflash_trt.quantized import (E2M1_VALUES, dequantize_fp8, dequantize_nvfp4, is_quantized,
                                  load_quantized_state_dict, unpack_e2m1)

mtq_qtensor = pytest.importorskip("modelopt.torch.quantization.qtensor", reason="needs nvidia-modelopt")


# -- numerics against ModelOpt's reference implementations (pure torch, CPU) ------------------------------------
@pytest.mark.parametrize("shape,std", [((64, 96), 1.0), ((128, 16), 0.02), ((3, 32, 256), 50.0), ((1, 48), 1e-3)])
def test_nvfp4_dequant_matches_modelopt(shape, std):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g) * std
    x[..., 5] = 0.0  # exact zeros and a few outliers too
    x.view(-1)[::97] *= 7
    qt, scale, scale_2 = mtq_qtensor.NVFP4QTensor.quantize(x.clone(), 16)
    assert qt._quantized_data.dtype == torch.uint8 and qt._quantized_data.shape[-1] == shape[-1] // 2
    assert scale.dtype == torch.float8_e4m3fn and scale.shape[-1] == shape[-1] // 16
    ref = qt.dequantize(dtype=torch.float32, scale=scale, double_scale=scale_2, block_sizes={-1: 16})
    ours = dequantize_nvfp4(qt._quantized_data, scale, scale_2)
    assert torch.equal(ours, ref)


def test_nvfp4_nibble_order_low_is_even():
    # byte 0x9A: low nibble 0xA = sign|2 -> -1.0 (even element), high nibble 0x9 = sign|1 -> -0.5 (odd element)
    packed = torch.tensor([[0x21, 0x9A, 0x70]], dtype=torch.uint8)
    assert unpack_e2m1(packed).tolist() == [[0.5, 1.0, -1.0, -0.5, 0.0, 6.0]]
    assert E2M1_VALUES[:8].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.mark.parametrize("axis", [None, 0])
def test_fp8_dequant_matches_modelopt(axis):
    x = torch.randn(48, 80, generator=torch.Generator().manual_seed(3)) * 0.3
    qt, scale = mtq_qtensor.FP8QTensor.quantize(x, axis=axis)
    ref = qt.dequantize(dtype=torch.float32, scale=scale)
    ours = dequantize_fp8(qt._quantized_data, scale.reshape(-1) if axis is not None else scale)
    assert torch.equal(ours, ref)
    assert (ours - x).abs().max() <= x.abs().max() * 2 ** -4


def test_bad_scales_are_one_line_errors():
    with pytest.raises(CheckpointError, match="weight_scale has shape"):
        dequantize_nvfp4(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 2).to(torch.float8_e4m3fn),
                         torch.tensor(1.0))
    with pytest.raises(CheckpointError, match="one per output row"):
        dequantize_fp8(torch.zeros(4, 8).to(torch.float8_e4m3fn), torch.ones(3))


# -- real ModelOpt exports, written by dflash-build ---------------------------------------------------------------
@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from dflash_trt.builder.cli import main

    root = tmp_path_factory.mktemp("qengines")
    t = tiny.make_target(str(root / "t"), "llama")
    d = tiny.make_drafter(str(root / "d"), t)
    out = {}
    for name, flags in {"fp8": ["--quantization", "fp8", "--kv-cache-dtype", "fp8"],
                        "nvfp4": ["--quantization", "nvfp4"]}.items():
        out[name] = str(root / f"engine_{name}")
        rc = main(["--target", t, "--draft", d, "--output", out[name], "--calib-samples", "6", "--quiet", *flags])
        assert rc == 0
    return t, out


def _hf_logits(model_dir_or_state, ids, source_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    if isinstance(model_dir_or_state, str):
        model = AutoModelForCausalLM.from_pretrained(model_dir_or_state, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source_dir), dtype=torch.float32)
        model.load_state_dict(model_dir_or_state, strict=True)  # exactly the plain HF names, nothing left over
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def test_is_quantized(engines, tmp_path):
    t, e = engines
    assert not is_quantized(t)
    assert is_quantized(os.path.join(e["fp8"], "target")) and is_quantized(os.path.join(e["nvfp4"], "target"))
    only_cfg = tmp_path / "cfg_only"
    only_cfg.mkdir()
    (only_cfg / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "modelopt"}}))
    assert is_quantized(str(only_cfg))


# A 4-layer random target amplifies weight noise: 3% random noise on its projections alone gives cos ~0.95, and
# NVFP4's ~10% per-weight error more (the exact per-tensor checks live in test_builder.py). These bounds catch a
# wrong dequantisation (swapped nibbles, missing scale_2: cos near 0), not format error.
@pytest.mark.parametrize("fmt,min_cos", [("fp8", 0.9), ("nvfp4", 0.5)])
def test_exports_dequantise_to_hf_names_and_close_logits(engines, fmt, min_cos):
    t, e = engines
    target = os.path.join(e[fmt], "target")
    state = load_quantized_state_dict(target, torch.float32)
    assert not any(n.endswith(("_scale", "_scale_2")) for n in state)
    assert all(v.dtype == torch.float32 for v in state.values())
    ids = [1, 9, 14, 20, 33, 40, 51, 60, 77, 90, 101, 120]
    ref = _hf_logits(t, ids, t)
    got = _hf_logits(state, ids, t)
    cos = torch.nn.functional.cosine_similarity(ref, got, dim=-1)
    assert cos.min() > min_cos, cos


@pytest.fixture(scope="module")
def accepting(tmp_path_factory):
    """FP8 and NVFP4 engines of an accepting pair: the real drafter's drafts are sometimes accepted (boost 12 keeps
    that true after NVFP4's error; with the default boost 5 the NVFP4 target accepts none of them)."""
    from dflash_trt.builder.cli import main

    root = tmp_path_factory.mktemp("accepting")
    t, d = tiny.accepting_pair(str(root), boost=12.0)
    out = {}
    for fmt, flags in (("fp8", ["--kv-cache-dtype", "fp8"]), ("nvfp4", [])):  # k/v scales are read past too
        out[fmt] = str(root / fmt)
        assert main(["--target", t, "--draft", d, "--output", out[fmt], "--quantization", fmt, "--calib-samples", "4",
                     "--quiet", *flags]) == 0
    return out


PROMPTS = [[4, 5, 6], [11, 7, 9, 10], [30] * 12]


def _ar(engine):
    import dflash_trt

    sp = dflash_trt.SamplingParams(max_tokens=24, ignore_eos=True)
    return [o.token_ids for o in dflash_trt.LLM(engine, speculative=False).generate(PROMPTS, sp)]


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_engine_dirs_are_lossless_with_the_real_drafter(accepting, fmt):
    """dflash_trt.LLM(ENGINE_DIR): with drafting forced on (fixed K), speculative output equals the same
    engine's AR path, and some drafts are accepted (the adaptive policy may stop drafting: nothing proven)."""
    import dflash_trt

    llm = dflash_trt.LLM(accepting[fmt], draft_len_policy="fixed")
    out = llm.generate(PROMPTS, dflash_trt.SamplingParams(max_tokens=24, ignore_eos=True))
    assert [o.token_ids for o in out] == _ar(accepting[fmt])
    assert all(len(o.token_ids) == 24 for o in out)
    assert sum(o.drafted for o in out) > 0 and sum(o.accepted for o in out) > 0


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_engine_dirs_are_lossless_at_every_acceptance_length(accepting, fmt):
    """The real drafter gets few drafts accepted on a random pair: here drafts are the engine's own AR
    continuation broken at a rotating position, so every acceptance length 0..K is verified by the quantized
    target, and the output still equals AR."""
    import dflash_trt

    ar = dict(zip(map(tuple, PROMPTS), _ar(accepting[fmt])))
    llm = dflash_trt.LLM(accepting[fmt], draft_len_policy="fixed", trace=True)
    llm.engine.proposer.propose = tiny.as_propose(tiny.OracleDrafter(lambda s: ar[tuple(s.prompt_ids)]))
    out = llm.generate(PROMPTS, dflash_trt.SamplingParams(max_tokens=24, ignore_eos=True))
    assert [o.token_ids for o in out] == list(ar.values())
    k = llm.engine.max_draft_len
    assert {a for o in out for _, a in o.trace} == set(range(k + 1))


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_dflash_generate_runs_engine_dirs(accepting, fmt, capsys):
    """`dflash-generate ENGINE_DIR`: the positional engine directory, text prompt through the target's tokenizer."""
    import dflash_trt
    from dflash_trt.cli.generate import main as generate

    assert generate([accepting[fmt], "--prompt", "hi", "--max-tokens", "6", "--json", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    llm = dflash_trt.LLM(accepting[fmt], speculative=False)
    ar = llm.generate(["hi"], dflash_trt.SamplingParams(max_tokens=6))[0]
    assert rec["token_ids"] == ar.token_ids and len(ar.token_ids) > 0 and rec["text"] == ar.text


def test_unsupported_exports_are_refused(engines, tmp_path):
    import shutil

    _, e = engines
    awq = tmp_path / "awq"
    shutil.copytree(os.path.join(e["fp8"], "target"), awq)
    hq = json.loads((awq / "hf_quant_config.json").read_text())
    hq["quantization"]["quant_algo"] = "W4A16_AWQ"
    (awq / "hf_quant_config.json").write_text(json.dumps(hq))
    with pytest.raises(CheckpointError, match="W4A16_AWQ.*dflash-build --quantization fp8 or nvfp4"):
        load_quantized_state_dict(str(awq))
    gptq = tmp_path / "gptq"
    gptq.mkdir()
    (gptq / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq"}}))
    with pytest.raises(CheckpointError, match="'gptq'"):
        load_quantized_state_dict(str(gptq))
