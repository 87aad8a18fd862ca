"""dflash-build: the engine directory contract (trtllm.md), quantized tensors, YAML/scripts, --check, bad inputs."""
import concurrent.futures
import glob
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open

import tiny
from dflash_trt.builder.cli import main as build_main
from dflash_trt.quantized import dequantize_fp8, dequantize_nvfp4

CLI = [sys.executable, "-m", "dflash_trt.builder.cli"]
LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\.weight$")
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def tensors(d: str) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with safe_open(f, "pt") as h:
            out |= {k: h.get_tensor(k) for k in h.keys()}
    return out


edit_json = tiny.edit_json


def ensure_tokenizer(path: str) -> None:
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        return
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    table = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<mask>"] + [chr(c) for c in range(32, 127)])}
    tk = Tokenizer(models.WordLevel(table, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>").save_pretrained(path)


def drop_tokenizer(path: str) -> None:
    for name in TOKENIZER:
        if os.path.exists(os.path.join(path, name)):
            os.remove(os.path.join(path, name))


def leftovers(parent: str) -> list[str]:
    return [n for n in os.listdir(parent) if ".dflash-tmp-" in n or ".dflash-old-" in n]


# -- fixtures: two pairs, three engines ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    t_llama = tiny.make_target(str(root / "t_llama"), "llama")
    ensure_tokenizer(t_llama)
    d_llama = tiny.make_drafter(str(root / "d_llama"), t_llama, block_size=8)
    t_qwen = tiny.make_target(str(root / "t_qwen"), "qwen3", head_dim=32)
    drop_tokenizer(t_qwen)  # calibration falls back on byte ids
    edit_json(os.path.join(t_qwen, "config.json"), architectures=None)  # ModelOpt export quirk: builder sets it
    d_qwen = tiny.make_drafter(str(root / "d_qwen"), t_qwen, block_size=6)
    calib = root / "calib.jsonl"
    calib.write_text("\n".join(json.dumps(r) for r in [
        {"text": "def add(a, b):\n    return a + b"}, {"prompt": "Explain how tides work."},
        {"text": "The quick brown fox jumps over the lazy dog."}, {"prompt": "SELECT * FROM t WHERE x > 3;"}]) + "\n")
    return {"root": str(root), "llama": (t_llama, d_llama), "qwen": (t_qwen, d_qwen), "calib": str(calib)}


HAVE_MODELOPT = importlib.util.find_spec("modelopt") is not None
needs_modelopt = pytest.mark.skipif(not HAVE_MODELOPT, reason="needs nvidia-modelopt (pip install nvidia-modelopt "
                                    "requests pyyaml, without touching torch)")


# Which pair each engine of the matrix was built from.
PAIR = {"bf16": "llama", "fp8": "llama", "nvfp4": "qwen", "qwen_bf16": "qwen", "qwen_fp8": "qwen",
        "llama_nvfp4": "llama", "kvfp8": "llama"}
KV_FP8 = {"fp8", "kvfp8"}


@pytest.fixture(scope="module")
def build_runs(pairs, tmp_path_factory):
    """The matrix: Llama and Qwen3 x bf16/fp8/nvfp4, plus bf16 weights with an FP8 KV cache.

    bf16 (Llama, tp 2), fp8 + FP8 KV (Llama, user calibration JSONL), nvfp4 (Qwen3, built-in calibration) and the
    rest with defaults. qwen_fp8 is built by a real process with the progress display on: its stdout and stderr
    are returned too."""
    root = tmp_path_factory.mktemp("engines")
    t, d = pairs["llama"]
    tq, dq = pairs["qwen"]
    runs = {
        "bf16": ["--target", t, "--draft", d, "--tp-size", "2", "--max-draft-len", "5", "--max-seq-len", "1024",
                 "--max-batch-size", "4"],
        "fp8": ["--target", t, "--draft", d, "--quantization", "fp8", "--kv-cache-dtype", "fp8",
                "--calib-data", pairs["calib"]],
        "nvfp4": ["--target", tq, "--draft", dq, "--quantization", "nvfp4", "--calib-samples", "8"],
        "qwen_bf16": ["--target", tq, "--draft", dq],
        "llama_nvfp4": ["--target", t, "--draft", d, "--quantization", "nvfp4", "--calib-samples", "4"],
        "kvfp8": ["--target", t, "--draft", d, "--kv-cache-dtype", "fp8", "--calib-samples", "4"],
    }
    out = {}
    for name, argv in runs.items():
        if name not in ("bf16", "qwen_bf16") and not HAVE_MODELOPT:
            continue
        out[name] = str(root / name)
        assert build_main([*argv, "--output", out[name], "--quiet"]) == 0
    shown = None
    if HAVE_MODELOPT:
        out["qwen_fp8"] = str(root / "qwen_fp8")
        shown = run_cli("--target", tq, "--draft", dq, "--quantization", "fp8", "--calib-samples", "4",
                        "--output", out["qwen_fp8"])
        assert shown.returncode == 0, shown.stderr
    return out, shown


@pytest.fixture(scope="module")
def built(build_runs):
    return build_runs[0]


def assert_tokenizer_copied(src: str, dst: str) -> list[str]:
    """Every tokenizer file of the source is in dst, byte for byte; returns their names."""
    from dflash_trt.builder.calib import TOKENIZER_FILES

    names = [n for n in TOKENIZER_FILES if os.path.isfile(os.path.join(src, n))]
    for n in names:
        with open(os.path.join(src, n), "rb") as a, open(os.path.join(dst, n), "rb") as b:
            assert a.read() == b.read(), n
    return names


def record(engine: str) -> dict:
    with open(os.path.join(engine, "engine.json")) as f:
        return json.load(f)


# -- tensors: names, dtypes, shapes of trtllm.md ------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["bf16", "qwen_bf16"])
def test_bf16_target_is_a_bf16_copy(pairs, built, engine):
    src_dir = pairs[PAIR[engine]][0]
    src, out = tensors(src_dir), tensors(os.path.join(built[engine], "target"))
    assert set(out) == set(src)
    for n, t in src.items():
        assert out[n].dtype == torch.bfloat16 and out[n].shape == t.shape
        assert torch.equal(out[n], t.to(torch.bfloat16))
    assert not os.path.exists(os.path.join(built[engine], "target", "hf_quant_config.json"))
    with open(os.path.join(built[engine], "target", "config.json")) as f:
        cfg = json.load(f)
    assert cfg["dtype"] == "bfloat16" and "quantization_config" not in cfg
    assert cfg["architectures"] == [{"llama": "LlamaForCausalLM", "qwen": "Qwen3ForCausalLM"}[PAIR[engine]]]
    copied = assert_tokenizer_copied(src_dir, os.path.join(built[engine], "target"))
    assert ("tokenizer.json" in copied) == (PAIR[engine] == "llama")  # the Qwen3 source has none


@needs_modelopt
@pytest.mark.parametrize("engine", ["fp8", "qwen_fp8"])
def test_fp8_target_contract(pairs, built, engine):
    from modelopt.torch.quantization.qtensor import FP8QTensor

    src_dir = pairs[PAIR[engine]][0]
    src, out = tensors(src_dir), tensors(os.path.join(built[engine], "target"))
    linears = [n for n in src if LINEAR.match(n)]
    assert len(linears) == 4 * 7
    expected = set(src) | {n[: -len("weight")] + s for n in linears for s in ("weight_scale", "input_scale")}
    if engine in KV_FP8:
        expected |= {n.replace("weight", "k_scale") for n in linears if ".k_proj." in n}
        expected |= {n.replace("weight", "v_scale") for n in linears if ".v_proj." in n}
    assert set(out) == expected
    for n, orig in src.items():
        o = orig.to(torch.bfloat16).float()  # the builder calibrates the bf16 model
        if n not in linears:  # embeddings, lm_head, norms: excluded from quantization
            assert out[n].dtype == torch.bfloat16 and torch.equal(out[n].float(), o), n
            continue
        base = n[: -len("weight")]
        w, s, a = out[n], out[base + "weight_scale"], out[base + "input_scale"]
        assert w.dtype == torch.float8_e4m3fn and w.shape == orig.shape
        assert s.dtype == torch.float32 and s.shape == () and a.dtype == torch.float32 and a.shape == ()
        assert torch.isclose(s, o.abs().max() / 448, rtol=1e-6)  # weight_scale = amax / 448
        deq = dequantize_fp8(w, s)
        # ModelOpt's own FP8 of the same bf16 weight (it divides in the model dtype) gives the same values
        ref = FP8QTensor.quantize(orig.to(torch.bfloat16), scales=s)[0].dequantize(dtype=torch.float32, scale=s)
        assert torch.equal(deq, ref), n
        # e4m3 half-ulp (2^-4 relative; 2^-10 x scale for subnormals), plus the bf16 division's rounding
        bound = torch.maximum(o.abs() * (2 ** -4 + 2 ** -8), s * 2 ** -10) + 1e-12
        assert ((deq - o).abs() <= bound).all(), n
    for i in range(4):
        p = f"model.layers.{i}."
        if engine in KV_FP8:
            k_scale = out[p + "self_attn.k_proj.k_scale"]
            assert k_scale.dtype == torch.float32 and k_scale.shape == ()
        qkv = [out[p + f"self_attn.{x}_proj.input_scale"] for x in "qkv"]
        assert torch.equal(qkv[0], qkv[1]) and torch.equal(qkv[0], qkv[2])  # q/k/v share one input_scale
        assert torch.equal(out[p + "mlp.gate_proj.input_scale"], out[p + "mlp.up_proj.input_scale"])
    copied = assert_tokenizer_copied(src_dir, os.path.join(built[engine], "target"))  # beside the ModelOpt export
    assert ("tokenizer.json" in copied) == (PAIR[engine] == "llama")


@needs_modelopt
@pytest.mark.parametrize("engine", ["nvfp4", "llama_nvfp4"])
def test_nvfp4_target_contract(pairs, built, engine):
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    src_dir = pairs[PAIR[engine]][0]
    src, out = tensors(src_dir), tensors(os.path.join(built[engine], "target"))
    linears = [n for n in src if LINEAR.match(n)]
    expected = set(src) | {n[: -len("weight")] + s for n in linears
                           for s in ("weight_scale", "weight_scale_2", "input_scale")}
    assert set(out) == expected  # no k_scale / v_scale: KV cache stays in the model dtype
    groups = {}
    for n, orig in src.items():
        o = orig.to(torch.bfloat16).float()
        if n not in linears:
            assert out[n].dtype == torch.bfloat16 and torch.equal(out[n].float(), o), n
            continue
        base = n[: -len("weight")]
        w, s, s2, a = (out[base + k] for k in ("weight", "weight_scale", "weight_scale_2", "input_scale"))
        rows, k = orig.shape
        assert w.dtype == torch.uint8 and list(w.shape) == [rows, k // 2]
        assert s.dtype == torch.float8_e4m3fn and list(s.shape) == [rows, k // 16]
        assert s2.dtype == torch.float32 and s2.shape == () and a.dtype == torch.float32 and a.shape == ()
        deq = dequantize_nvfp4(w, s, s2)
        # ModelOpt's own NVFP4 on the same original weight and global scale gives the same bits and values
        qt, s_ref, _ = NVFP4QTensor.quantize(o.clone(), 16, weights_scaling_factor_2=s2)
        assert torch.equal(w, qt._quantized_data) and torch.equal(s.float(), s_ref.float()), n
        assert torch.equal(deq, qt.dequantize(dtype=torch.float32, scale=s, double_scale=s2, block_sizes={-1: 16}))
        block_amax = o.view(rows, -1, 16).abs().amax(-1, keepdim=True)
        err = (deq - o).view(rows, -1, 16).abs()
        assert (err <= block_amax / 6 * (1 + 2 ** -4) + 1e-9).all(), n  # half the widest e2m1 step (4 -> 6)
        group = base.rsplit(".", 2)[0] + (".qkv" if re.search(r"\.[qkv]_proj\.$", base) else
                                          ".gate_up" if re.search(r"\.(gate|up)_proj\.$", base) else base)
        groups.setdefault(group, []).append((o.abs().max(), s2, a))
    for g, members in groups.items():  # q/k/v and gate/up share input_scale and weight_scale_2 = amax/(448*6)
        amax = max(m[0] for m in members)
        for _, s2, a in members:
            assert torch.isclose(s2, amax / (448 * 6), rtol=1e-6), g
            assert torch.equal(a, members[0][2]), g
    assert_tokenizer_copied(src_dir, os.path.join(built[engine], "target"))


@pytest.mark.parametrize("engine,pair", [("bf16", "llama"), pytest.param("fp8", "llama", marks=needs_modelopt),
                                         pytest.param("nvfp4", "qwen", marks=needs_modelopt)])
def test_drafter_copied_in_bf16(pairs, built, engine, pair):
    d = pairs[pair][1]
    src, out = tensors(d), tensors(os.path.join(built[engine], "draft"))
    assert set(out) == set(src)  # z-lab names, no model. prefix, nothing quantized
    for n, t in src.items():
        assert out[n].dtype == torch.bfloat16 and torch.equal(out[n], t.to(torch.bfloat16)), n
    with open(os.path.join(built[engine], "draft", "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(d, "config.json")) as f:
        orig = json.load(f)
    assert cfg["dtype"] == "bfloat16" and cfg["torch_dtype"] == "bfloat16"
    assert {k: v for k, v in cfg.items() if k not in ("dtype", "torch_dtype")} == \
        {k: v for k, v in orig.items() if k not in ("dtype", "torch_dtype")}


@needs_modelopt
def test_hf_quant_config_and_config_json(built):
    for engine, algo, kv in (("fp8", "FP8", "FP8"), ("nvfp4", "NVFP4", None), ("qwen_fp8", "FP8", None),
                             ("llama_nvfp4", "NVFP4", None)):
        tdir = os.path.join(built[engine], "target")
        with open(os.path.join(tdir, "hf_quant_config.json")) as f:
            hq = json.load(f)
        assert hq["producer"]["name"] == "modelopt" and hq["producer"]["version"]
        q = hq["quantization"]
        assert q["quant_algo"] == algo and q["kv_cache_quant_algo"] == kv
        assert "lm_head" in q["exclude_modules"] and "model.embed_tokens" in q["exclude_modules"]
        assert (q.get("group_size") == 16) == (algo == "NVFP4")
        with open(os.path.join(tdir, "config.json")) as f:
            cfg = json.load(f)
        assert cfg["quantization_config"]["quant_method"] == "modelopt"
        assert cfg["quantization_config"]["quant_algo"] == algo
        assert cfg["architectures"] == [record(built[engine])["architecture"]]
    with open(os.path.join(built["nvfp4"], "target", "config.json")) as f:
        assert json.load(f)["architectures"] == ["Qwen3ForCausalLM"]  # set although the source config lacked it


@needs_modelopt
def test_bf16_weights_with_fp8_kv_cache(pairs, built):
    """--quantization bf16 --kv-cache-dtype fp8: ModelOpt calibrates only the k/v scales; weights stay bf16."""
    yaml = pytest.importorskip("yaml")
    engine = built["kvfp8"]
    tdir = os.path.join(engine, "target")
    with open(os.path.join(tdir, "hf_quant_config.json")) as f:
        q = json.load(f)["quantization"]
    assert q["quant_algo"] is None and q["kv_cache_quant_algo"] == "FP8"
    src, out = tensors(pairs["llama"][0]), tensors(tdir)
    scales = {n for n in out if n.endswith(("k_proj.k_scale", "v_proj.v_scale"))}
    assert set(out) == set(src) | scales and len(scales) == 2 * 4  # no weight or input scales
    assert all(out[n].dtype == torch.float32 and out[n].shape == () and out[n] > 0 for n in scales)
    for n, t in src.items():
        assert out[n].dtype == torch.bfloat16 and torch.equal(out[n], t.to(torch.bfloat16)), n
    with open(os.path.join(engine, "trtllm", "dflash.yaml")) as f:
        assert yaml.safe_load(f)["kv_cache_config"]["dtype"] == "fp8"
    assert (record(engine)["quantization"], record(engine)["kv_cache_dtype"]) == ("bf16", "fp8")
    assert build_main(["--check", engine, "--quiet"]) == 0


# -- engine.json, YAML, scripts ---------------------------------------------------------------------------------
def _drafter_config(pairs, engine: str) -> dict:
    with open(os.path.join(pairs[PAIR[engine]][1], "config.json")) as f:
        return json.load(f)


def test_engine_json_records_everything(pairs, built):
    from dflash_trt import __version__
    from dflash_trt.builder import FORMAT_VERSION, TRTLLM_VERSION

    for name, engine in built.items():
        rec = record(engine)
        for key in ("format_version", "tool", "sources", "quantization", "kv_cache_dtype", "tp_size", "block_size",
                    "max_draft_len", "target_layer_ids", "mask_token_id", "max_seq_len", "max_batch_size",
                    "tensorrt_llm_version", "files", "gpu", "drafter_attention_backend", "kv_cache_reuse",
                    "context_recompute_tail", "rejection_sampling", "stacks"):
            assert key in rec, (name, key)
        assert rec["format_version"] == FORMAT_VERSION
        assert rec["tool"] == {"name": "dflash-build", "version": __version__}
        assert rec["tensorrt_llm_version"] == TRTLLM_VERSION == "1.4.0rc1"
        assert (rec["gpu"], rec["drafter_attention_backend"], rec["kv_cache_reuse"], rec["context_recompute_tail"],
                rec["rejection_sampling"], rec["stacks"]) == (None, "VANILLA", False, None, True,
                                                              ["trtllm", "vllm", "sglang"])
        t, d = pairs[PAIR[name]]
        assert (rec["sources"]["target"], rec["sources"]["draft"]) == (t, d)
        dcfg = _drafter_config(pairs, name)
        assert rec["target_layer_ids"] == dcfg["dflash_config"]["target_layer_ids"], name
        assert rec["mask_token_id"] == dcfg["dflash_config"]["mask_token_id"]
        assert rec["block_size"] == dcfg["block_size"]
        on_disk = sorted(os.path.relpath(os.path.join(d, f), engine) for d, _, fs in os.walk(engine) for f in fs)
        assert sorted(rec["files"]) == [f for f in on_disk if f != "engine.json"]
        for rel, digest in rec["files"].items():
            with open(os.path.join(engine, rel), "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == digest, rel
    bf = record(built["bf16"])
    assert (bf["quantization"], bf["kv_cache_dtype"], bf["tp_size"], bf["block_size"], bf["max_draft_len"],
            bf["max_seq_len"], bf["max_batch_size"], bf["mask_token_id"]) == ("bf16", "auto", 2, 8, 5, 1024, 4, 3)
    assert bf["sources"]["calib_data"] is None and bf["modelopt"] is None
    qb = record(built["qwen_bf16"])  # defaults: block_size - 1, min(8192, max_position_embeddings), 32, tp 1
    assert (qb["max_draft_len"], qb["max_seq_len"], qb["max_batch_size"], qb["tp_size"]) == (5, 2048, 32, 1)


@needs_modelopt
def test_engine_json_quantized_values(pairs, built):
    import modelopt

    for name, quant, kv in (("fp8", "fp8", "fp8"), ("nvfp4", "nvfp4", "auto"), ("qwen_fp8", "fp8", "auto"),
                            ("llama_nvfp4", "nvfp4", "auto"), ("kvfp8", "bf16", "fp8")):
        rec = record(built[name])
        assert (rec["quantization"], rec["kv_cache_dtype"]) == (quant, kv), name
        assert rec["modelopt"]["version"] == modelopt.__version__
        assert rec["sources"]["calib_data"] == (pairs["calib"] if name == "fp8" else "builtin")
    assert record(built["nvfp4"])["max_draft_len"] == 5  # default: block_size 6 - 1


@needs_modelopt
def test_calibration_sources(pairs, built):
    fp8, nv = record(built["fp8"])["calibration"], record(built["nvfp4"])["calibration"]
    assert fp8["source"] == pairs["calib"] and fp8["samples"] == 4 and fp8["tokenizer"] == "target"
    assert nv["source"] == "builtin" and nv["samples"] == 8 and nv["tokenizer"] == "bytes"
    from dflash_trt.builder.calib import load_texts

    texts = load_texts(None, 1000)
    assert len(texts) >= 60 and sum("def " in t or "{" in t for t in texts) >= 10  # prose and code


def test_dflash_yaml(built):
    from dflash_trt.builder.trtllm_schema import problems

    yaml = pytest.importorskip("yaml")
    for name, engine in built.items():
        rec = record(engine)
        with open(os.path.join(engine, "trtllm", "dflash.yaml")) as f:
            text = f.read()
        y = yaml.safe_load(text)
        assert problems(y) == [], name  # every key and value exists in the pinned TensorRT-LLM release
        assert text.startswith(f"# TensorRT-LLM {rec['tensorrt_llm_version']} LLM-API options")
        assert set(y) == {"speculative_config", "max_seq_len", "max_batch_size", "max_num_tokens",
                          "cuda_graph_config", "kv_cache_config", "enable_chunked_prefill", "attn_backend"}
        sc = y["speculative_config"]
        assert sc["decoding_type"] == "DFlash" and sc["speculative_model"] == os.path.join(engine, "draft")
        assert sc["max_draft_len"] == rec["max_draft_len"] < rec["block_size"]
        assert sc["mask_token_id"] == rec["mask_token_id"] and sc["target_layer_ids"] == rec["target_layer_ids"]
        assert sc["attention_backend"] == "VANILLA" and sc["use_rejection_sampling"] is True  # portable defaults
        assert "context_recompute_tail" not in sc  # no block reuse, nothing to recompute
        assert (y["max_seq_len"], y["max_batch_size"]) == (rec["max_seq_len"], rec["max_batch_size"])
        assert y["max_num_tokens"] >= y["max_batch_size"] * (sc["max_draft_len"] + 1)
        assert y["cuda_graph_config"] == {"enable_padding": True, "max_batch_size": rec["max_batch_size"]}
        assert y["enable_chunked_prefill"] is True and y["attn_backend"] == "TRTLLM"
        assert y["kv_cache_config"]["enable_block_reuse"] is False
        assert y["kv_cache_config"].get("dtype") == ("fp8" if name in KV_FP8 else None), name


@needs_modelopt
def test_progress_display(build_runs):
    """A real build process without --quiet: the long steps show on stderr, stdout holds only the summary."""
    engines, run = build_runs
    for step in ("target: loading", "calibrating (", "target: ModelOpt export", "drafter: bf16 copy", "hashing"):
        assert step in run.stderr, step
    lines = run.stdout.splitlines()
    assert lines[0] == f"built {engines['qwen_fp8']}"
    assert all(line.startswith("  ") for line in lines[1:]) and re.search(r"^  quantization +fp8$", run.stdout, re.M)
    assert "Traceback" not in run.stderr


def test_launch_scripts(built):
    from dflash_trt.builder import TRTLLM_VERSION

    engine = built["bf16"]
    text = {n: open(os.path.join(engine, "trtllm", n)).read() for n in ("serve.sh", "serve_multinode.sh", "bench.sh")}
    for name, body in text.items():
        path = os.path.join(engine, "trtllm", name)
        assert os.access(path, os.X_OK) and body.startswith("#!/usr/bin/env bash")
        assert subprocess.run(["bash", "-n", path]).returncode == 0
        assert TRTLLM_VERSION in body and '--config "$CONFIG"' in body and "--tp" in body
    assert re.search(r"trtllm-serve serve \"\$ENGINE/target\" --backend pytorch --tp_size 2 ", text["serve.sh"])
    assert re.search(r"mpirun -n \"\$WORLD\" trtllm-llmapi-launch trtllm-serve serve ", text["serve_multinode.sh"])
    assert 'WORLD="${WORLD:-2}"' in text["serve_multinode.sh"]
    assert re.search(r"trtllm-bench --model \S+ --model_path \"\$ENGINE/target\" ", text["bench.sh"])
    assert "--backend pytorch --tp 2" in text["bench.sh"]


def test_moved_engine_scripts_relocate_the_drafter_path(built, tmp_path):
    """serve.sh passes a copy of dflash.yaml naming the moved draft/ (trtllm-serve itself is stubbed)."""
    moved = tmp_path / "moved"
    shutil.copytree(built["bf16"], moved)
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "trtllm-serve").write_text('#!/usr/bin/env bash\nfor a in "$@"; do [ "$prev" = --config ] && '
                                       'cat "$a"; prev="$a"; done\n')
    (stub / "trtllm-serve").chmod(0o755)
    env = dict(os.environ, PATH=f"{stub}:{os.environ['PATH']}", TMPDIR=str(tmp_path))
    r = subprocess.run(["bash", str(moved / "trtllm" / "serve.sh")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f'speculative_model: "{moved}/draft"' in r.stdout


# -- --check ------------------------------------------------------------------------------------------------------
def run_cli(*argv, cwd=None):
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, cwd=cwd, timeout=300)


@needs_modelopt
def test_check_passes_then_fails_on_corruption(built, tmp_path, capsys):
    engine = str(tmp_path / "copy")
    shutil.copytree(built["fp8"], engine)
    assert build_main(["--check", engine, "--quiet"]) == 0  # in-process: the passing check loads transformers
    ok = capsys.readouterr()
    assert ok.out.startswith(f"OK: {engine} matches engine.json") and "fp8" in ok.out and ok.err == ""
    weights = os.path.join(engine, "target", "model.safetensors")
    with open(weights, "r+b") as f:  # flip one byte in the middle of the tensor data
        f.seek(os.path.getsize(weights) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    bad = run_cli("--check", engine, "--quiet")  # a real process: exit code 2, one line, no traceback
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.splitlines()) == 1 and bad.stderr.startswith("error: ")
    assert "target/model.safetensors (sha256 differs)" in bad.stderr and "dflash-build --force" in bad.stderr
    assert "Traceback" not in bad.stderr


def _rehash(engine, rel: str) -> None:
    """Record a file's new sha256 in engine.json: the edit passes the re-hash, so re-validation must catch it."""
    path = os.path.join(engine, "engine.json")
    rec = record(str(engine))
    with open(os.path.join(engine, rel), "rb") as f:
        rec["files"][rel] = hashlib.sha256(f.read()).hexdigest()
    with open(path, "w") as f:
        json.dump(rec, f)


def test_check_in_process_other_mismatches(built, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    from dflash_trt.builder.check import check_engine
    from dflash_trt.errors import DFlashError

    engine = tmp_path / "e"
    shutil.copytree(built["bf16"], engine)
    assert check_engine(str(engine))["files"] == len(record(str(engine))["files"])
    (engine / "target" / "extra.safetensors").write_bytes(b"x")
    with pytest.raises(DFlashError, match="target/extra.safetensors \\(not listed in engine.json\\)"):
        check_engine(str(engine))
    os.remove(engine / "target" / "extra.safetensors")
    os.remove(engine / "trtllm" / "bench.sh")
    with pytest.raises(DFlashError, match="trtllm/bench.sh \\(missing\\)"):
        check_engine(str(engine))
    assert build_main(["--check", str(engine), "--target", str(engine / "target"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "takes no --target" in err

    # edits that keep every sha256 right: the pair and the formats are re-validated, not only re-hashed
    def fresh(name):
        e = tmp_path / name
        shutil.copytree(built["bf16"], e)
        return e

    e = fresh("mask")
    cfg = json.loads((e / "draft" / "config.json").read_text())
    cfg["dflash_config"]["mask_token_id"] = 5000
    (e / "draft" / "config.json").write_text(json.dumps(cfg))
    _rehash(e, "draft/config.json")
    with pytest.raises(DFlashError, match="mask_token_id 5000 out of range"):
        check_engine(str(e))
    e = fresh("quant")
    edit_json(str(e / "engine.json"), quantization="fp8")
    with pytest.raises(DFlashError, match="engine.json says fp8 but target/ holds quant_algo None"):
        check_engine(str(e))
    e = fresh("fp32_drafter")
    w = load_file(str(e / "draft" / "model.safetensors"))
    save_file({k: v.float() for k, v in w.items()}, str(e / "draft" / "model.safetensors"))
    _rehash(e, "draft/model.safetensors")
    with pytest.raises(DFlashError, match="drafter tensor .* is not bfloat16"):
        check_engine(str(e))
    e = fresh("block")
    edit_json(str(e / "engine.json"), block_size=16)
    with pytest.raises(DFlashError, match="engine.json block_size 16 != drafter config 8"):
        check_engine(str(e))


@needs_modelopt
def test_check_quant_algo_mismatch(built, tmp_path):
    from dflash_trt.builder.check import check_engine
    from dflash_trt.errors import DFlashError

    e = tmp_path / "e"
    shutil.copytree(built["fp8"], e)
    edit_json(str(e / "engine.json"), quantization="nvfp4")
    with pytest.raises(DFlashError, match="engine.json says nvfp4 but target/ holds quant_algo 'FP8'"):
        check_engine(str(e))
    edit_json(str(e / "engine.json"), quantization="fp8", kv_cache_dtype="auto")
    with pytest.raises(DFlashError, match="kv_cache_dtype 'auto' but target/ holds kv_cache_quant_algo 'FP8'"):
        check_engine(str(e))


# -- atomic writes ------------------------------------------------------------------------------------------------
def test_force_replaces_and_a_failed_build_leaves_nothing(pairs, tmp_path, monkeypatch, capsys):
    import dflash_trt.builder.build as build_mod

    t, d = pairs["llama"]
    out = str(tmp_path / "engine")
    base = ["--target", t, "--draft", d, "--quiet"]
    assert build_main([*base, "--output", out, "--max-draft-len", "3"]) == 0
    assert build_main([*base, "--output", out, "--max-draft-len", "4"]) == 2  # exists, no --force
    assert record(out)["max_draft_len"] == 3
    assert build_main([*base, "--output", out, "--max-draft-len", "4", "--force"]) == 0
    assert record(out)["max_draft_len"] == 4 and leftovers(str(tmp_path)) == []
    capsys.readouterr()

    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(build_mod, "write_draft", boom)
    assert build_main([*base, "--output", out, "--max-draft-len", "5", "--force"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: internal failure: RuntimeError: disk on fire")
    assert record(out)["max_draft_len"] == 4  # the previous engine survives a failed --force rebuild
    nested = tmp_path / "a" / "b" / "engine"
    assert build_main([*base, "--output", str(nested)]) == 1
    assert not (tmp_path / "a").exists() and leftovers(str(tmp_path)) == []


# -- every bad input: one line on stderr, exit 2, no output directory ----------------------------------------------
def _error_cases(pairs, root):
    t, d = pairs["llama"]

    def copy_target(name, **cfg):
        p = os.path.join(root, name)
        shutil.copytree(t, p)
        if cfg:
            edit_json(os.path.join(p, "config.json"), **cfg)
        return p

    empty = os.path.join(root, "empty")
    os.makedirs(empty)
    bad_json = copy_target("bad_json")
    with open(os.path.join(bad_json, "config.json"), "w") as f:
        f.write("{oops")
    no_weights = copy_target("no_weights")
    os.remove(os.path.join(no_weights, "model.safetensors"))
    corrupt = copy_target("corrupt")
    with open(os.path.join(corrupt, "model.safetensors"), "wb") as f:
        f.write(b"\x00\x01garbage")
    mistral = copy_target("mistral", model_type="mistral", architectures=["MistralForCausalLM"])
    seqcls = copy_target("seqcls", architectures=["LlamaForSequenceClassification"])
    other_t = tiny.make_target(os.path.join(root, "other_t"), "llama", hidden=32, heads=2, kv_heads=1)
    d_other = tiny.make_drafter(os.path.join(root, "d_other"), other_t)
    d_layers = tiny.make_drafter(os.path.join(root, "d_layers"), t, target_layer_ids=[1, 7])
    d_gpt2 = tiny.make_drafter(os.path.join(root, "d_gpt2"), t, extra={"model_type": "gpt2"})
    d_mask = tiny.make_drafter(os.path.join(root, "d_mask"), t, mask_token_id=5000)
    d_fc = tiny.make_drafter(os.path.join(root, "d_fc"), t)  # fc.weight built for 2 layers, config names 3
    edit_json(os.path.join(d_fc, "config.json"), dflash_config={"mask_token_id": 3, "target_layer_ids": [0, 1, 2]})
    d_no_weights = tiny.make_drafter(os.path.join(root, "d_no_weights"), t)
    os.remove(os.path.join(d_no_weights, "model.safetensors"))
    d_bad_json = tiny.make_drafter(os.path.join(root, "d_bad_json"), t)
    with open(os.path.join(d_bad_json, "config.json"), "w") as f:
        f.write("{oops")
    t40 = tiny.make_target(os.path.join(root, "t40"), "llama", hidden=40, heads=4, kv_heads=2)
    d40 = tiny.make_drafter(os.path.join(root, "d40"), t40)
    exists = os.path.join(root, "out_exists")
    os.makedirs(exists)
    with open(os.path.join(exists, "keep.txt"), "w") as f:
        f.write("mine")
    bad_calib = os.path.join(root, "bad.jsonl")
    with open(bad_calib, "w") as f:
        f.write('{"text": "fine"}\nnot json\n')

    def pair(target=t, draft=d, name=None):
        return ["--target", target, "--draft", draft]

    fp8 = ["--quantization", "fp8"]
    return {  # case: (argv without --output, expected fragments)
        "target_missing": (pair(target=os.path.join(root, "nope")), ["--target", "directory not found"]),
        "draft_missing": (pair(draft=os.path.join(root, "nope")), ["--draft", "directory not found"]),
        "target_not_a_checkpoint": (pair(target=empty), ["has no config.json", "Hugging Face"]),
        "target_unreadable_config": (pair(target=bad_json), ["unreadable", "config.json"]),
        "target_no_weights": (pair(target=no_weights), ["no *.safetensors"]),
        "target_corrupt_weights": (pair(target=corrupt), ["unreadable", "model.safetensors"]),
        "unknown_architecture": (pair(target=mistral), ["'mistral'", "not supported", "LlamaForCausalLM"]),
        "unknown_architecture_head": (pair(target=seqcls), ["LlamaForSequenceClassification", "not supported"]),
        "unknown_drafter_type": (pair(draft=d_gpt2), ["'gpt2'", "qwen3 or llama"]),
        "pair_hidden_size": (pair(draft=d_other), ["hidden_size", "another target"]),
        "pair_layer_ids": (pair(draft=d_layers), ["target_layer_ids [7]", "out of range"]),
        "pair_mask_id": (pair(draft=d_mask), ["mask_token_id 5000 out of range", "vocab_size 128"]),
        "pair_fc": (pair(draft=d_fc), ["fc.weight has 128 input features", "expected", "192"]),
        "draft_no_weights": (pair(draft=d_no_weights), ["drafter", "no *.safetensors"]),
        "draft_unreadable_config": (pair(draft=d_bad_json), ["drafter config", "unreadable"]),
        "max_seq_len_too_long": (pair() + ["--max-seq-len", "4096"],
                                 ["exceeds the target's max_position_embeddings 2048", "--max-seq-len 2048"]),
        "max_draft_len_ge_block": (pair() + ["--max-draft-len", "8"],
                                   ["--max-draft-len 8 must be below the drafter block_size 8", "use --max-draft-len 7"]),
        "tp_not_dividing_heads": (pair() + ["--tp-size", "4"], ["--tp-size 4 does not divide", "use --tp-size 1 or 2"]),
        "tp_not_a_runtime_size": (pair() + ["--tp-size", "3"], ["--tp-size 3 is not supported", "use 1, 2, 4 or 8"]),
        "tp_out_of_range": (pair() + ["--tp-size", "9"], ["--tp-size 9 is not supported", "use 1, 2, 4 or 8"]),
        "output_in_proc": (pair() + ["--output", "/proc/dflash-build-test"],
                           ["cannot write --output /proc/dflash-build-test", "choose another --output"]),
        "gpu_unknown": (pair() + ["--gpu", "v100"], ["--gpu", "invalid choice: 'v100'", "h100"]),
        "gpu_nvfp4_on_hopper": (pair() + ["--gpu", "h100", "--quantization", "nvfp4"],
                                ["--quantization nvfp4 needs Blackwell", "--gpu h100 is SM90", "use --quantization fp8"]),
        "recompute_tail_without_reuse": (pair() + ["--context-recompute-tail", "64"],
                                         ["--context-recompute-tail only applies with --kv-cache-reuse"]),
        "nvfp4_in_features": (pair(target=t40, draft=d40) + ["--quantization", "nvfp4"],
                              ["divisible by 16", "hidden_size", "--quantization fp8"]),
        "existing_output": (pair() + ["--output", exists], ["already exists", "--force"]),
        "calib_missing": (pair() + fp8 + ["--calib-data", os.path.join(root, "none.jsonl")],
                          ["--calib-data", "file not found", "JSONL"]),
        "calib_bad_line": (pair() + fp8 + ["--calib-data", bad_calib], ["line 2 is not JSON"]),
        "missing_flag": (["--target", t], ["--draft, --output are required"]),
        "check_missing_dir": (["--check", os.path.join(root, "nope")], ["--check", "directory not found"]),
        "check_not_an_engine": (["--check", t], ["no engine.json"]),
    }


# The error list of the issue runs as real processes (python -m dflash_trt.builder.cli), two at a time; the
# further cases run in-process through the same main() (each CLI process pays ~2 s of torch import alone).
SUBPROCESS_CASES = ["target_missing", "target_not_a_checkpoint", "target_unreadable_config", "target_no_weights",
                    "target_corrupt_weights", "unknown_architecture", "pair_hidden_size", "pair_layer_ids",
                    "max_draft_len_ge_block", "tp_not_dividing_heads", "tp_not_a_runtime_size", "output_in_proc",
                    "existing_output"]
IN_PROCESS_CASES = ["draft_missing", "unknown_architecture_head", "unknown_drafter_type", "tp_out_of_range",
                    "pair_mask_id", "pair_fc", "draft_no_weights", "draft_unreadable_config", "max_seq_len_too_long",
                    "nvfp4_in_features", "calib_missing", "calib_bad_line", "missing_flag", "check_missing_dir",
                    "check_not_an_engine", "gpu_unknown", "gpu_nvfp4_on_hopper", "recompute_tail_without_reuse"]


def _argv(root, name, argv):
    if "--output" not in argv and "--check" not in argv and name != "missing_flag":
        argv = argv + ["--output", os.path.join(root, "out", name)]
    return argv


@pytest.fixture(scope="module")
def error_setup(pairs, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("errors"))
    return root, _error_cases(pairs, root)


@pytest.fixture(scope="module")
def error_runs(error_setup):
    root, cases = error_setup

    def run(name):
        r = run_cli(*_argv(root, name, cases[name][0]), cwd=root)
        return name, (r.returncode, r.stdout, r.stderr)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:  # 2 cores: two CLI processes at a time
        return dict(pool.map(run, SUBPROCESS_CASES))


def _check_error(root, cases, case, rc, stdout, stderr):
    assert rc == 2, (rc, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr and stdout == ""
    for fragment in cases[case][1]:
        assert fragment in lines[0], (fragment, lines[0])
    assert not os.path.exists(os.path.join(root, "out", case))
    assert os.listdir(os.path.join(root, "out_exists")) == ["keep.txt"]  # an existing output is never touched
    if os.path.isdir(os.path.join(root, "out")):
        assert leftovers(os.path.join(root, "out")) == []


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_bad_input_cli_process(error_setup, error_runs, case):
    root, cases = error_setup
    _check_error(root, cases, case, *error_runs[case])


@pytest.mark.parametrize("case", IN_PROCESS_CASES)
def test_bad_input_in_process(error_setup, case, capsys):
    root, cases = error_setup
    if case in ("nvfp4_in_features", "calib_missing", "calib_bad_line") and not HAVE_MODELOPT:
        pytest.skip("the ModelOpt check comes first without nvidia-modelopt")
    try:
        rc = build_main(_argv(root, case, cases[case][0]) + ["--quiet"])
    except SystemExit as e:  # argparse errors exit from inside main()
        rc = e.code
    out = capsys.readouterr()
    _check_error(root, cases, case, rc, out.out, out.err)


def test_missing_modelopt_is_a_one_line_error(pairs, tmp_path, monkeypatch, capsys):
    import dflash_trt.builder.validate as validate

    real = validate.importlib.util.find_spec
    monkeypatch.setattr(validate.importlib.util, "find_spec", lambda n, *a: None if n == "modelopt" else real(n, *a))
    t, d = pairs["llama"]
    out = tmp_path / "engine"
    assert build_main(["--target", t, "--draft", d, "--output", str(out), "--quantization", "fp8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs NVIDIA ModelOpt" in err and "pip install nvidia-modelopt" in err
    assert not out.exists()


@needs_modelopt
def test_pair_is_validated_before_any_heavy_work(error_setup, monkeypatch, capsys):
    """A mismatched pair with --quantization fp8 fails before the target model is loaded or ModelOpt runs."""
    import transformers

    import dflash_trt.builder.build as build_mod

    def must_not_run(*a, **k):
        raise AssertionError("heavy work ran before the pair was validated")

    monkeypatch.setattr(build_mod, "write_target_modelopt", must_not_run)
    monkeypatch.setattr(build_mod, "write_target_bf16", must_not_run)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", must_not_run)
    root, cases = error_setup
    out = os.path.join(root, "out", "heavy")
    rc = build_main([*cases["pair_hidden_size"][0], "--quantization", "fp8", "--output", out, "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "hidden_size" in err and "another target" in err, err
    assert not os.path.exists(out)


def test_every_error_case_is_run(error_setup):
    assert sorted(error_setup[1]) == sorted(SUBPROCESS_CASES + IN_PROCESS_CASES)


def test_tp_sizes_agree_with_the_native_runtime(tmp_path, capsys):
    """dflash-build accepts exactly the tp sizes dflash-serve runs, and never suggests another one (a 6-head
    model divides by 3 and 6, which the runtime refuses)."""
    from dflash_trt.builder.validate import tp_sizes
    from dflash_trt.config import DraftConfig, TargetConfig
    from dflash_trt.errors import DFlashError
    from dflash_trt.tensor_parallel import TP_SIZES, validate_tp

    assert tp_sizes() == tuple(TP_SIZES)
    t6 = tiny.make_target(str(tmp_path / "t6"), "llama", hidden=48, heads=6, kv_heads=6)
    d6 = tiny.make_drafter(str(tmp_path / "d6"), t6, heads=6, kv_heads=6)
    tcfg, dcfg = TargetConfig.from_dir(t6), DraftConfig.from_dir(d6)
    for tp in (2, 3, 4, 6):
        out = tmp_path / f"e{tp}"
        rc = build_main(["--target", t6, "--draft", d6, "--output", str(out), "--tp-size", str(tp), "--quiet"])
        err = capsys.readouterr().err
        try:
            validate_tp(tp, tcfg, dcfg)
            runtime_ok = True
        except DFlashError:
            runtime_ok = False
        assert (rc == 0) == runtime_ok, (tp, err)
        if rc:
            assert err.count("\n") == 1 and out.exists() is False
            suggested = re.findall(r"\d+", err.split(": use ")[-1])
            assert suggested and all(int(n) in TP_SIZES for n in suggested), err
            assert ("--tp-size 1 or 2" in err) if tp == 4 else ("use 1, 2, 4 or 8" in err), err
