"""dflash.yaml against the pinned TensorRT-LLM release's field list (builder/trtllm_schema.py), the drafter
attention backend per GPU, KV-cache reuse with its recompute tail, rejection sampling."""
import json
import os
import re

import pytest

import tiny
from dflash_trt.builder import trtllm
from dflash_trt.builder import trtllm_schema as schema
from dflash_trt.builder.cli import main as build_main

yaml = pytest.importorskip("yaml")

# name: (extra flags, expected attention_backend, expected stderr line or None)
BUILDS = {
    "portable": ([], "VANILLA", None),
    "h100": (["--gpu", "h100"], "FA4", "drafter attention: FA4 (--gpu h100: Hopper SM90)"),
    "h200": (["--gpu", "h200"], "FA4", "drafter attention: FA4 (--gpu h200: Hopper SM90)"),
    "b200": (["--gpu", "b200"], "TRTLLM", "drafter attention: TRTLLM (--gpu b200: Blackwell SM100)"),
    "b300": (["--gpu", "b300"], "TRTLLM", "drafter attention: TRTLLM (--gpu b300: Blackwell Ultra SM103)"),
    "a100": (["--gpu", "a100"], "VANILLA", "drafter attention: VANILLA (--gpu a100: Ampere SM80 has neither FA4 "
                                           "(SM90) nor trtllm-gen (SM100/SM103) kernels)"),
    "reuse": (["--kv-cache-reuse"], "VANILLA", None),
    "reuse_tail": (["--kv-cache-reuse", "--context-recompute-tail", "96", "--gpu", "gb200"], "TRTLLM",
                   "drafter attention: TRTLLM (--gpu gb200: Blackwell SM100)"),
    "no_rejection": (["--no-rejection-sampling"], "VANILLA", None),
}


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("schema")
    t = tiny.make_target(str(root / "t"), "llama")
    d = tiny.make_drafter(str(root / "d"), t, block_size=8)
    out = {}
    for name, (flags, _, _) in BUILDS.items():
        r = tiny_build(t, d, str(root / name), flags)
        out[name] = (str(root / name), r)
    return out


def tiny_build(t, d, out, flags):
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = build_main(["--target", t, "--draft", d, "--output", out, "--quiet", *flags])
    return rc, err.getvalue()


def read_yaml(engine):
    with open(os.path.join(engine, "trtllm", "dflash.yaml")) as f:
        text = f.read()
    return text, yaml.safe_load(text)


def test_every_generated_yaml_fits_the_pinned_release(engines):
    for name, (engine, (rc, err)) in engines.items():
        assert rc == 0, (name, err)
        text, y = read_yaml(engine)
        assert schema.problems(y) == [], name
        assert text.startswith(f"# TensorRT-LLM {schema.TRTLLM_VERSION} LLM-API options")
        with open(os.path.join(engine, "engine.json")) as f:
            assert json.load(f)["tensorrt_llm_version"] == schema.TRTLLM_VERSION == "1.4.0rc1"


def test_drafter_attention_follows_the_gpu_and_says_so(engines):
    for name, (flags, backend, line) in BUILDS.items():
        engine, (rc, err) = engines[name]
        _, y = read_yaml(engine)
        assert y["speculative_config"]["attention_backend"] == backend, name
        assert y["attn_backend"] == "TRTLLM"  # the target's attention is not the drafter's
        with open(os.path.join(engine, "engine.json")) as f:
            rec = json.load(f)
        assert rec["drafter_attention_backend"] == backend and rec["gpu"] == (flags[flags.index("--gpu") + 1]
                                                                             if "--gpu" in flags else None)
        if line is None:
            assert err == "", (name, err)  # the portable default prints nothing
        else:
            assert err.splitlines() == [line], (name, err)


def test_kv_cache_reuse_writes_the_recompute_tail_with_its_reason(engines):
    for name, tail in (("reuse", 256), ("reuse_tail", 96)):
        text, y = read_yaml(engines[name][0])
        assert y["kv_cache_config"]["enable_block_reuse"] is True
        assert y["speculative_config"]["context_recompute_tail"] == tail
        # the comment sits right above the key and says why
        m = re.search(r"((?:  # .*\n)+)  context_recompute_tail: (\d+)\n", text)
        assert m and int(m.group(2)) == tail, text
        assert "drafter" in m.group(1) and "prefix-cache hit" in m.group(1)
    for name in ("portable", "h100", "no_rejection"):
        text, y = read_yaml(engines[name][0])
        assert y["kv_cache_config"]["enable_block_reuse"] is False and "context_recompute_tail" not in text


def test_rejection_sampling_for_sampled_requests(engines):
    _, y = read_yaml(engines["portable"][0])
    assert y["speculative_config"]["use_rejection_sampling"] is True
    text, y = read_yaml(engines["no_rejection"][0])
    assert y["speculative_config"]["use_rejection_sampling"] is False and "rejection sampling against" not in text


def test_the_checker_names_what_the_release_would_refuse():
    good = trtllm.llm_api_options(draft_dir="/e/draft", max_draft_len=7, mask_token_id=3, target_layer_ids=[1, 2],
                                  max_seq_len=1024, max_batch_size=8, max_num_tokens=1024, kv_cache_dtype="fp8",
                                  ep_size=2, drafter_attention="FA4", kv_cache_reuse=True,
                                  context_recompute_tail=64)
    assert schema.problems(good) == []

    def broken(path, value):
        bad = json.loads(json.dumps(good))
        *parents, key = path.split(".")
        node = bad
        for p in parents:
            node = node[p]
        node[key] = value
        return schema.problems(bad)

    assert broken("speculative_config.attention_backend", "FA3") == [
        "speculative_config.attention_backend is 'FA3', not one of VANILLA, TRTLLM, FA4"]
    assert broken("speculative_config.draft_block", 8) == [
        "speculative_config.draft_block is not a field of TensorRT-LLM 1.4.0rc1's speculative_config"]
    assert broken("kv_cache_config.enable_prefix_caching", True) == [
        "kv_cache_config.enable_prefix_caching is not a field of TensorRT-LLM 1.4.0rc1's kv_cache_config"]
    assert broken("attention_backend", "FA4") == ["attention_backend is not a field of TensorRT-LLM 1.4.0rc1's "
                                                  "llm_args"]
    assert broken("speculative_config.max_draft_len", -1) == [
        "speculative_config.max_draft_len is -1, below its minimum 0"]
    assert broken("speculative_config.use_rejection_sampling", "yes") == [
        "speculative_config.use_rejection_sampling is 'yes', not a bool"]
    assert broken("speculative_config.target_layer_ids", [1, "2"]) == [
        "speculative_config.target_layer_ids is [1, '2'], not an int list"]
    assert broken("kv_cache_config.free_gpu_memory_fraction", 1.5) == [
        "kv_cache_config.free_gpu_memory_fraction is 1.5, above its maximum 1.0"]
    assert broken("speculative_config.decoding_type", "Eagle3") == [
        "speculative_config.decoding_type is 'Eagle3', not one of DFlash", "speculative_config.decoding_type must be "
        "DFlash"]
    assert broken("max_batch_size", True) == ["max_batch_size is True, not an int"]
    # 1.4.0rc1's new fields are known, with their allowed values
    for key, value in (("spec_dec_variant", 1), ("skip_ctx_buffer_budget_check", True), ("moe_backend", "CUTLASS")):
        assert broken(f"speculative_config.{key}", value) == []
    assert broken("speculative_config.moe_backend", "FLASHINFER") != []


def _break_the_writer(monkeypatch):
    real = trtllm.llm_api_options

    def writer(**kw):
        opts = real(**kw)
        opts["speculative_config"]["attention_backend"] = "FA3"  # not a backend of the pinned release
        opts["kv_cache_config"]["enable_prefix_caching"] = True  # a vLLM name, not TensorRT-LLM's
        return opts

    monkeypatch.setattr(trtllm, "llm_api_options", writer)


def test_a_broken_writer_never_ships(engines, tmp_path, monkeypatch, capsys):
    """The build itself checks the options: a writer emitting a key or value the release refuses fails the build
    (an internal error: it is the writer's bug, not the user's) and leaves nothing."""
    t, d = os.path.dirname(engines["portable"][0]) + "/t", os.path.dirname(engines["portable"][0]) + "/d"
    _break_the_writer(monkeypatch)
    out = tmp_path / "e"
    assert build_main(["--target", t, "--draft", d, "--output", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dflash.yaml does not fit TensorRT-LLM 1.4.0rc1" in err
    assert "speculative_config.attention_backend is 'FA3'" in err and "kv_cache_config.enable_prefix_caching" in err
    assert os.listdir(tmp_path) == []


def test_the_file_check_catches_a_broken_writer(engines, tmp_path, monkeypatch):
    """Without the build's own check, the file-level check of these tests flags the same YAML: the test above is
    not the only guard, and test_every_generated_yaml_fits_the_pinned_release would fail on such a writer."""
    t, d = os.path.dirname(engines["portable"][0]) + "/t", os.path.dirname(engines["portable"][0]) + "/d"
    _break_the_writer(monkeypatch)
    monkeypatch.setattr(trtllm, "check_options", lambda opts: None)
    out = tmp_path / "e"
    assert build_main(["--target", t, "--draft", d, "--output", str(out), "--quiet"]) == 0
    _, y = read_yaml(str(out))
    assert schema.problems(y) == [
        "speculative_config.attention_backend is 'FA3', not one of VANILLA, TRTLLM, FA4",
        "kv_cache_config.enable_prefix_caching is not a field of TensorRT-LLM 1.4.0rc1's kv_cache_config"]


def test_every_written_field_is_in_the_field_list():
    """The writer's keys (every flag combination) are a subset of the pinned release's fields, and the field list
    holds the whole 1.4.0rc1 DFlashDecodingConfig signature."""
    assert set(schema.DFLASH_DECODING_CONFIG) >= {
        "max_draft_len", "max_total_draft_tokens", "speculative_model", "moe_backend", "max_concurrency",
        "draft_len_schedule", "load_format", "acceptance_rate_window_size", "acceptance_rate_threshold",
        "use_rejection_sampling", "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty",
        "spec_dec_variant", "mask_token_id", "target_layer_ids", "context_recompute_tail", "decoding_type",
        "attention_backend", "skip_ctx_buffer_budget_check"}
    assert schema.DFLASH_DECODING_CONFIG["attention_backend"].choices == ("VANILLA", "TRTLLM", "FA4")
    for reuse in (False, True):
        for kv in ("auto", "fp8"):
            for ep in (None, 4):
                opts = trtllm.llm_api_options(
                    draft_dir="/x/draft", max_draft_len=3, mask_token_id=1, target_layer_ids=[0], max_seq_len=64,
                    max_batch_size=2, max_num_tokens=64, kv_cache_dtype=kv, ep_size=ep, kv_cache_reuse=reuse,
                    context_recompute_tail=32 if reuse else None)
                assert schema.problems(opts) == []


def test_one_pinned_version_everywhere():
    """The Dockerfile's base image, the docs and the generated files name the release the field list is from."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "Dockerfile")) as f:
        assert re.search(r"^ARG TRTLLM_VERSION=(\S+)$", f.read(), re.M).group(1) == schema.TRTLLM_VERSION
    with open(os.path.join(root, "docs", "serving.md")) as f:
        assert re.findall(r"TensorRT-LLM \(`(\S+?)`", f.read()) == [schema.TRTLLM_VERSION]
    assert trtllm.TRTLLM_VERSION == schema.TRTLLM_VERSION
    assert f"tensorrt_llm=={schema.TRTLLM_VERSION}" in trtllm.serve_script(
        tool_version="x", tp_size=1, max_seq_len=8, max_batch_size=1, max_num_tokens=8)
