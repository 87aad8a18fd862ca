"""dflash-train as a new user meets it: bad data or flags give one line, exit 2 and leave nothing behind, so the same
command works once fixed (no --resume); a run stopped by SIGTERM exits 143 (test_train.py)."""
import json
import subprocess
import sys

import pytest

import tiny


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny.make_target(str(tmp_path_factory.mktemp("t") / "t"), layers=2, hidden=32, heads=2, kv_heads=1)


def train_args(target, out, *extra):
    return ["--target", target, "--output", str(out), "--block-size", "4", "--num-layers", "1", "--mask-token-id",
            "3", "--max-steps", "1", "--threads", "1", "--eval-every", "1000", *extra]


def train(target, out, *extra):
    cmd = [sys.executable, "-m", "dflash_trt.builder.train_cli", *train_args(target, out, *extra)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def one_line_error(r, *words):
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip() and not x.startswith("[")]  # not the progress log
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


GOOD = "".join(json.dumps({"id": i, "prompt_ids": [5 + i, 6, 7], "output_ids": [8, 9 + i, 10, 11, 12]}) + "\n"
               for i in range(4))


@pytest.mark.parametrize("case", ["empty", "missing", "malformed", "no output_ids", "bad token"])
def test_bad_data_is_one_line_and_leaves_nothing(target, tmp_path, case):
    data, out = tmp_path / "d.jsonl", tmp_path / "run"
    lines = GOOD.splitlines()
    if case == "empty":
        data.write_text("")
    elif case == "malformed":
        data.write_text("\n".join([lines[0], '{"id": 1, "prompt_ids": [5, 6]', *lines[2:]]) + "\n")
    elif case == "no output_ids":
        data.write_text("\n".join([lines[0], lines[1], json.dumps({"id": 7, "prompt_ids": [5]})]) + "\n")
    elif case == "bad token":
        data.write_text("\n".join([lines[0], json.dumps({"id": 7, "prompt_ids": [5], "output_ids": [999]})]) + "\n")
    msg = one_line_error(train(target, out, "--data", str(data)))
    expect = {"empty": "0 usable record", "missing": "no training data", "malformed": "line 2",
              "no output_ids": "line 3: output_ids missing", "bad token": "line 2: output_ids token id 999"}[case]
    assert expect in msg
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    if case != "malformed":
        return
    # an OUTPUT that already existed (empty) stays, and stays empty
    out.mkdir()
    one_line_error(train(target, out, "--data", str(data)))
    assert list(out.iterdir()) == []
    # fixed, the same command (no --resume) trains
    data.write_text(GOOD)
    r = train(target, out, "--data", str(data))
    assert r.returncode == 0, r.stderr
    assert (out / "drafter" / "config.json").is_file()


def test_a_torn_last_line_is_skipped_not_fatal(target, tmp_path):
    data, out = tmp_path / "d.jsonl", tmp_path / "run"
    data.write_text(GOOD + '{"id": 9, "prompt_ids": [5, 6')  # a write cut by a kill
    r = train(target, out, "--data", str(data))
    assert r.returncode == 0, r.stderr
    assert "skipped 1 torn line(s) (line 5" in r.stderr


@pytest.mark.parametrize("flags,words", [(["--block-size", "1"], ["--block-size 1", "2 or more"]),
                                         (["--block-size", "0"], ["--block-size 0"]),
                                         (["--target-layer-ids", "5"], ["refused by the runtime", "[5]"])])
def test_drafters_the_runtime_refuses_are_refused_up_front(target, tmp_path, flags, words):
    data, out = tmp_path / "d.jsonl", tmp_path / "run"
    data.write_text(GOOD)
    one_line_error(train(target, out, "--data", str(data), *flags), *words)
    assert not out.exists()


CHAT = json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]})


@pytest.mark.parametrize("line,extra,words", [
    ('{"messages": "Hi"}', [], ["line 2", "messages is not a non-empty list"]),
    (json.dumps({"messages": [{"role": "user", "content": "Hi"}]}), [], ["line 2", "no assistant turn",
                                                                         "--regenerate"]),
    (json.dumps({"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "x"}]}), [],
     ["line 2", "messages[0] content is not text"]),
    (json.dumps({"conversations": [{"from": "alien", "value": "x"}]}), [], ["line 2", "from 'alien'"]),
    (json.dumps({"text": "Hi"}), [], ["line 2", "none of the training data shapes", "conversations"]),
    ("{not json", [], ["line 2 is not JSON"]),
    (CHAT, ["--regenerate", "vllm"], ["vLLM is not installed"]),
    (CHAT, ["--device", "cuda"], ["--device cuda", "no CUDA device"]),
])
def test_bad_chat_data_is_one_line_and_leaves_nothing(target, tmp_path, capsys, line, extra, words):
    from types import SimpleNamespace

    from dflash_trt.builder.train_cli import main

    data, out = tmp_path / "d.jsonl", tmp_path / "run"
    data.write_text("\n".join([CHAT, line, CHAT]) + "\n")
    rc = main(train_args(target, out, "--data", str(data), *extra))  # in-process: these fail before any training
    one_line_error(SimpleNamespace(returncode=rc, stderr=capsys.readouterr().err), *words)
    assert not out.exists(), sorted(p.name for p in out.iterdir())
