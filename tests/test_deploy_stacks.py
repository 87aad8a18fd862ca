"""One engine directory, three stacks: the vLLM and SGLang launch files beside trtllm/ load the same target/ and
draft/ with their DFlash options, and engine.json's sha256 covers them (dflash-build --check)."""
import hashlib
import json
import os
import shutil
import subprocess

import pytest

import tiny
from dflash_trt.builder.check import check_engine
from dflash_trt.builder.cli import main as build_main
from dflash_trt.builder.stacks import STACK_FILES, stacks_for
from dflash_trt.errors import DFlashError

K = 5  # max_draft_len of the builds below (drafter block_size 8)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("stacks")
    t = tiny.make_target(str(root / "t"), "llama")
    d = tiny.make_drafter(str(root / "d"), t, block_size=8)
    base = ["--target", t, "--draft", d, "--max-draft-len", str(K), "--max-seq-len", "1024",
            "--max-batch-size", "4", "--quiet"]
    out = {"tp2": str(root / "tp2"), "reuse": str(root / "reuse")}
    assert build_main([*base, "--tp-size", "2", "--output", out["tp2"]]) == 0
    assert build_main([*base, "--kv-cache-reuse", "--output", out["reuse"]]) == 0
    return out


def record(engine):
    with open(os.path.join(engine, "engine.json")) as f:
        return json.load(f)


def run_with_stub(script, stub_name, tmp_path):
    """Run a launch script with `stub_name` on PATH replaced by a stub that prints its argv, one per line."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    (stub / stub_name).write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    (stub / stub_name).chmod(0o755)
    env = dict(os.environ, PATH=f"{stub}:{os.environ['PATH']}", HOST="127.0.0.1", PORT="9100")
    r = subprocess.run(["bash", script, "--extra-flag"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_the_three_stacks_are_written_and_hashed(engines):
    for engine in engines.values():
        rec = record(engine)
        assert rec["stacks"] == ["trtllm", "vllm", "sglang"]
        for rel in [f for s in rec["stacks"] for f in STACK_FILES[s]]:
            path = os.path.join(engine, rel)
            with open(path, "rb") as f:
                assert rec["files"][rel] == hashlib.sha256(f.read()).hexdigest(), rel
            if rel.endswith(".sh"):
                assert os.access(path, os.X_OK) and subprocess.run(["bash", "-n", path]).returncode == 0
        assert check_engine(engine)["files"] == len(rec["files"])


def test_check_catches_an_edited_or_missing_launch_file(engines, tmp_path):
    for stack in ("vllm", "sglang"):
        e = tmp_path / f"edited_{stack}"
        shutil.copytree(engines["tp2"], e)
        with open(e / stack / "serve.sh", "a") as f:
            f.write("# edited\n")
        with pytest.raises(DFlashError, match=rf"{stack}/serve.sh \(sha256 differs\)"):
            check_engine(str(e))
        m = tmp_path / f"missing_{stack}"
        shutil.copytree(engines["tp2"], m)
        os.remove(m / stack / "serve.sh")
        with pytest.raises(DFlashError, match=rf"{stack}/serve.sh \(missing\)"):
            check_engine(str(m))
        # dropping the file from engine.json too does not get past --check: the stack still requires it
        rec = record(str(m))
        del rec["files"][f"{stack}/serve.sh"]
        (m / "engine.json").write_text(json.dumps(rec))
        with pytest.raises(DFlashError, match=rf"{stack}/serve.sh \(listed in engine.json, required\)"):
            check_engine(str(m))


def test_engines_from_before_the_other_stacks_still_check(engines, tmp_path):
    e = tmp_path / "old"
    shutil.copytree(engines["tp2"], e)
    rec = record(str(e))
    for stack in ("vllm", "sglang"):
        shutil.rmtree(e / stack)
        del rec["files"][f"{stack}/serve.sh"]
    del rec["stacks"]
    (e / "engine.json").write_text(json.dumps(rec))
    assert check_engine(str(e))["files"] == len(rec["files"])


def test_vllm_serves_the_same_target_and_drafter(engines, tmp_path):
    engine = engines["tp2"]
    moved = tmp_path / "moved engine"  # a space in the path, and not where it was built
    shutil.copytree(engine, moved)
    argv = run_with_stub(str(moved / "vllm" / "serve.sh"), "vllm", tmp_path)
    assert argv[:2] == ["serve", f"{moved}/target"] and argv[-1] == "--extra-flag"
    spec = json.loads(flag(argv, "--speculative-config"))
    assert spec == {"method": "dflash", "model": f"{moved}/draft", "num_speculative_tokens": K,
                    "draft_tensor_parallel_size": 2}
    assert os.path.isfile(os.path.join(spec["model"], "model.safetensors"))
    assert (flag(argv, "--tensor-parallel-size"), flag(argv, "--max-model-len"), flag(argv, "--max-num-seqs")) == \
        ("2", "1024", "4")
    assert int(flag(argv, "--max-num-batched-tokens")) == record(engine)["max_num_tokens"]
    assert (flag(argv, "--host"), flag(argv, "--port")) == ("127.0.0.1", "9100")
    assert "--no-enable-prefix-caching" in argv and "--kv-cache-dtype" not in argv
    reuse = run_with_stub(os.path.join(engines["reuse"], "vllm", "serve.sh"), "vllm", tmp_path)
    assert "--enable-prefix-caching" in reuse and "--no-enable-prefix-caching" not in reuse
    assert json.loads(flag(reuse, "--speculative-config"))["draft_tensor_parallel_size"] == 1


def test_vllm_refuses_a_path_its_json_cannot_hold(engines, tmp_path):
    moved = tmp_path / 'quo"te'
    shutil.copytree(engines["tp2"], moved)
    r = subprocess.run(["bash", str(moved / "vllm" / "serve.sh")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "move the engine directory" in r.stderr


def test_sglang_serves_the_same_target_and_drafter(engines, tmp_path):
    engine = engines["tp2"]
    argv = run_with_stub(os.path.join(engine, "sglang", "serve.sh"), "python3", tmp_path)
    assert argv[:2] == ["-m", "sglang.launch_server"] and argv[-1] == "--extra-flag"
    assert flag(argv, "--model-path") == f"{engine}/target"
    assert flag(argv, "--speculative-algorithm") == "DFLASH"
    assert flag(argv, "--speculative-draft-model-path") == f"{engine}/draft"
    # SGLang's block is the verify window, bonus token included: K drafts, K + 1, within the drafter's block
    window = int(flag(argv, "--speculative-dflash-block-size"))
    assert window == K + 1 <= record(engine)["block_size"]
    assert (flag(argv, "--tp-size"), flag(argv, "--context-length"), flag(argv, "--max-running-requests")) == \
        ("2", "1024", "4")
    assert "--disable-radix-cache" in argv
    reuse = run_with_stub(os.path.join(engines["reuse"], "sglang", "serve.sh"), "python3", tmp_path)
    assert "--disable-radix-cache" not in reuse


def test_trtllm_stays_the_default_contract(engines):
    """The vLLM and SGLang files are extra: the TensorRT-LLM files and their YAML are unchanged in role."""
    rec = record(engines["tp2"])
    assert rec["stacks"][0] == "trtllm" and rec["tensorrt_llm_version"] == "1.4.0rc1"
    for rel in STACK_FILES["trtllm"]:
        assert os.path.isfile(os.path.join(engines["tp2"], rel))


def test_which_stacks_run_which_drafter():
    assert stacks_for(["DFlashDraftModel"]) == ("trtllm", "vllm", "sglang")
    assert stacks_for(None) == ("trtllm", "vllm", "sglang")
    # TensorRT-LLM has only an RFC for DFlash2: no trtllm/ files for such a drafter
    assert stacks_for(["DFlash2DraftModel"]) == ("vllm", "sglang")
