"""dflash-serve: the real server (uvicorn, 127.0.0.1) on a tiny pair, driven by the official `openai` client.

Greedy and seeded output equal to `LLM.generate`, streaming, stop strings, usage, metrics, API key, 400s with
OpenAI error bodies (and the server keeps serving), 429 when the queue is full, client disconnects that free
their cache blocks, and the exact trtllm-serve command line of `--backend trtllm`.
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import httpx
import pytest

import tiny
from serving import free_port, wait_healthy
from dflash_trt import LLM, SamplingParams

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

KEY = "sk-dflash-test"
NAME = "tiny-dflash"
MAX_SEQ_LEN = 2048


def scrape(base: str) -> dict:
    """/metrics as {name or name{label=value,...}: value}."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = s.value
    return out


def wait_until(cond, timeout=10.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def all_blocks_free(base: str) -> bool:
    m = scrape(base)
    return (m["dflash_kv_cache_blocks_free"] == m["dflash_kv_cache_blocks_total"] and m["dflash_num_requests_running"]
            == 0 and m["dflash_num_requests_unfinished"] == 0)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny.accepting_pair(str(tmp_path_factory.mktemp("server")))  # 4 heads, 2 kv heads


@pytest.fixture(scope="module")
def ref(pair):
    t, d = pair
    return LLM(target=t, draft=d, max_seq_len=MAX_SEQ_LEN)


@pytest.fixture(scope="module")
def server(pair, tmp_path_factory):
    """`dflash-serve` in a subprocess, as a user starts it."""
    t, d = pair
    port = free_port()
    log = tmp_path_factory.mktemp("serverlog") / "server.log"
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("DFLASH_TEST_THREADS", "1"))
    env.pop("DFLASH_API_KEY", None)
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "dflash_trt.server.cli", "--target", t, "--draft", d,
                                 "--host", "127.0.0.1", "--port", str(port), "--max-batch-size", "4",
                                 "--max-seq-len", str(MAX_SEQ_LEN), "--api-key", KEY, "--served-model-name", NAME,
                                 "--log-level", "warning"], stdout=f, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, log.read_text)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text(), log.read_text()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=60)


def greedy(max_tokens, **kw):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


# -- the API --------------------------------------------------------------------------------------------------
def test_health_models_and_api_key(server, client):
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    assert [m.id for m in client.models.list().data] == [NAME]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.post(f"{server}/v1/completions", json={"model": NAME, "prompt": "hi"}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
        assert httpx.get(f"{server}/v1/models", headers=headers).status_code == 401
    bad = openai.OpenAI(base_url=f"{server}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=NAME, prompt="hi", max_tokens=2)
    assert httpx.get(f"{server}/metrics").status_code == 200  # /health and /metrics stay open


def test_completion_equals_llm_generate(client, ref):
    for prompt in ("Hello there, general", [20, 21, 22, 40, 41]):
        want = ref.generate([prompt], greedy(40))[0]
        r = client.completions.create(model=NAME, prompt=prompt, max_tokens=40, temperature=0)
        c = r.choices[0]
        assert c.text == want.text and c.finish_reason == want.finish_reason
        assert r.usage.prompt_tokens == len(want.prompt_token_ids)
        assert r.usage.completion_tokens == len(want.token_ids)
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        ext = r.model_extra["dflash"]
        # every decoding step counts, drafted or not: each commits one token plus its accepted drafts
        assert ext["steps"] + ext["accepted"] == want.steps + want.accepted == len(want.token_ids) - 1
        # which steps draft follows step costs each engine measures at start: tau over the server's own drafts
        assert ext["tau"] == (pytest.approx(1 + ext["accepted"] / ext["drafts"], abs=1e-3) if ext["drafts"] else None)
        assert r.model == NAME and r.object == "text_completion" and r.id.startswith("cmpl-")


def test_chat_equals_llm_generate(client, ref):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something"}]
    want = ref.generate([msgs], greedy(30), chat=True)[0]
    r = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=30, temperature=0)
    assert r.choices[0].message.content == want.text and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == want.finish_reason
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(want.prompt_token_ids), len(want.token_ids))
    r2 = client.chat.completions.create(model=NAME, messages=msgs, max_completion_tokens=30, temperature=0)
    assert r2.choices[0].message.content == want.text


def test_seeded_sampling_equals_llm_generate(client, ref):
    sp = SamplingParams(max_tokens=30, temperature=0.9, top_p=0.95, top_k=50, seed=1234, ignore_eos=True)
    want = ref.generate(["Once upon"], sp)[0]
    texts = [client.completions.create(model=NAME, prompt="Once upon", max_tokens=30, temperature=0.9, top_p=0.95,
                                       seed=1234, extra_body={"top_k": 50, "ignore_eos": True}).choices[0].text
             for _ in range(2)]
    assert texts == [want.text, want.text]


def test_streaming(client, ref):
    want = ref.generate(["Stream me"], greedy(60, ignore_eos=True))[0]
    chunks = list(client.completions.create(model=NAME, prompt="Stream me", max_tokens=60, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
    assert len(chunks) > 3
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert finals[0].model_extra["dflash"]["steps"] == want.steps
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 60
    assert chunks[-1].usage.prompt_tokens == len(want.prompt_token_ids)

    msgs = [{"role": "user", "content": "Stream a chat"}]
    want = ref.generate([msgs], greedy(40), chat=True)[0]
    chunks = list(client.chat.completions.create(model=NAME, messages=msgs, max_tokens=40, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_raw_sse_ends_with_done(server):
    with httpx.stream("POST", f"{server}/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": NAME, "prompt": "abc", "max_tokens": 5, "temperature": 0, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")


def test_stop_strings(client, ref):
    free = ref.generate(["Stop test"], greedy(40, ignore_eos=True))[0].text
    stop = free[5:7]
    cut = free[:free.find(stop)]
    r = client.completions.create(model=NAME, prompt="Stop test", max_tokens=40, temperature=0, stop=[stop, "\x7f"],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=NAME, prompt="Stop test", max_tokens=40, temperature=0, stop=stop,
                                            stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


# -- bad requests -----------------------------------------------------------------------------------------------
LONG = "x" * (MAX_SEQ_LEN + 10)  # the char tokenizer: one token per character
BAD = [
    ("completions", b'{"model": "tiny-dflash", "prompt": "hi",', None, "not valid JSON"),
    ("completions", b'["not", "an", "object"]', None, "JSON object"),
    ("completions", {"model": "gpt-4", "prompt": "hi"}, "model", "does not exist"),
    ("completions", {"model": NAME, "prompt": "hi", "max_tokens": 0}, "max_tokens", ">= 1"),
    ("completions", {"model": NAME, "prompt": "hi", "max_tokens": MAX_SEQ_LEN}, "max_tokens",
     "maximum context length"),
    ("completions", {"model": NAME, "prompt": LONG, "max_tokens": 1}, "prompt", "maximum context length"),
    ("completions", {"model": NAME, "prompt": "hi", "max_tokens": "10"}, "max_tokens", "integer"),
    ("completions", {"model": NAME, "prompt": "hi", "temperature": "hot"}, "temperature", "number"),
    ("completions", {"model": NAME, "prompt": 42}, "prompt", "string or an array"),
    ("completions", {"model": NAME, "prompt": "hi", "stop": 3}, "stop", "string"),
    ("completions", {"model": NAME, "prompt": "hi", "stream": "yes"}, "stream", "boolean"),
    ("completions", {"model": NAME, "prompt": "hi", "n": 2}, "n", "must be 1"),
    ("completions", {"model": NAME, "prompt": "hi", "top_p": 0}, "top_p", "(0, 1]"),
    ("completions", {"model": NAME, "prompt": [5, 999]}, "prompt", "out of range"),
    ("completions", {"model": NAME}, "prompt", "required"),
    ("completions", {"model": 7, "prompt": "hi"}, "model", "string"),
    ("chat/completions", {"model": NAME}, "messages", "required"),
    ("chat/completions", {"model": NAME, "messages": "hi"}, "messages", "array"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role",
     "one of"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                          "max_completion_tokens": MAX_SEQ_LEN}, "max_tokens", "maximum context length"),
    ("chat/completions", {"model": NAME, "messages": [{"role": "user", "content": LONG}]}, "messages",
     "maximum context length"),
]


@pytest.mark.parametrize("path,body,param,needle", BAD, ids=[f"{p}:{n}" for p, _, _, n in BAD])
def test_bad_request_is_400(server, path, body, param, needle):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(f"{server}/v1/{path}", headers={"Authorization": f"Bearer {KEY}",
                                                   "Content-Type": "application/json"}, **kw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert needle in err["message"] and err["param"] == param, err


def test_server_keeps_serving_after_errors(server, client, ref):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="nope", prompt="hi", max_tokens=3)
    assert "does not exist" in str(e.value)
    want = ref.generate(["still here"], greedy(12))[0]
    assert client.completions.create(model=NAME, prompt="still here", max_tokens=12,
                                     temperature=0).choices[0].text == want.text
    m = scrape(server)
    assert m["dflash_requests_rejected_total{status=400}"] >= len(BAD)
    assert all_blocks_free(server)


# -- disconnects free their cache at once -------------------------------------------------------------------------
def test_streaming_disconnect_frees_blocks(server):
    before = scrape(server).get("dflash_requests_total{finish_reason=abort}", 0)
    body = {"model": NAME, "prompt": "go on", "max_tokens": MAX_SEQ_LEN - 10, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few events: the request is running
        assert sum(1 for line in got if line.startswith("data: ")) >= 3
        assert scrape(server)["dflash_kv_cache_blocks_free"] < scrape(server)["dflash_kv_cache_blocks_total"]
    # leaving the `with` closes the connection mid-stream
    wait_until(lambda: all_blocks_free(server), 5, "blocks freed after a streaming disconnect")
    m = scrape(server)
    assert m["dflash_requests_total{finish_reason=abort}"] == before + 1


def test_nonstreaming_disconnect_frees_blocks(server):
    before = scrape(server).get("dflash_requests_total{finish_reason=abort}", 0)
    body = {"model": NAME, "prompt": "wait for it", "max_tokens": MAX_SEQ_LEN - 20, "temperature": 0,
            "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(f"{server}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=0.3)
    wait_until(lambda: all_blocks_free(server), 5, "blocks freed after a non-streaming disconnect")
    m = scrape(server)
    assert m["dflash_requests_total{finish_reason=abort}"] == before + 1


# -- metrics --------------------------------------------------------------------------------------------------
def test_metrics(server, client):
    before = scrape(server)
    r = client.completions.create(model=NAME, prompt="metrics", max_tokens=25, temperature=0,
                                  extra_body={"ignore_eos": True})
    m = scrape(server)
    assert m["dflash_requests_total{finish_reason=length}"] == before.get(
        "dflash_requests_total{finish_reason=length}", 0) + 1
    assert m["dflash_generation_tokens_total"] >= before["dflash_generation_tokens_total"] + 25
    assert m["dflash_prompt_tokens_total"] == before["dflash_prompt_tokens_total"] + len("metrics")
    for hist in ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds",
                 "batch_size"):
        assert m[f"dflash_{hist}_count"] > before[f"dflash_{hist}_count"], hist
    # tau is observed for requests that drafted (the adaptive policy may draft none on CPU): tau null otherwise
    drafted = r.model_extra["dflash"]["drafts"] > 0
    assert m["dflash_acceptance_length_count"] == before["dflash_acceptance_length_count"] + drafted
    assert (r.model_extra["dflash"]["tau"] is None) == (not drafted)
    if m["dflash_acceptance_length_count"]:
        assert m["dflash_acceptance_length_sum"] / m["dflash_acceptance_length_count"] >= 1.0
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_ratio"):
        assert m[f"dflash_{gauge}"] == 0
    assert m["dflash_max_queue"] == 16  # default: 4 x max_batch_size
    assert m["dflash_kv_cache_blocks_total"] > 0 and m["process_resident_memory_bytes"] > 0


def test_prefix_cache_counters(server, client):
    """vLLM's prefix-cache counters (tokens): a repeated 40-token prompt finds its first two 16-token blocks."""
    label = f"model_name={NAME}"
    key = "vllm:prefix_cache_{}_total{{%s}}" % label
    prompt = "the same long prompt, forty characters."
    before = scrape(server)
    rs = [client.completions.create(model=NAME, prompt=prompt, max_tokens=4, temperature=0) for _ in range(2)]
    m = scrape(server)
    assert rs[0].choices[0].text == rs[1].choices[0].text
    assert [r.usage.prompt_tokens_details.cached_tokens for r in rs] == [0, 2 * 16]  # per request, OpenAI's field
    assert m[key.format("queries")] - before[key.format("queries")] == 2 * 2 * 16
    assert m[key.format("hits")] - before[key.format("hits")] == 2 * 16


def test_vllm_speculation_counters_and_per_request_stats(pair):
    """vLLM's spec_decode counters move by exactly the per-request figures the responses carry; a request that
    never drafted says tau null; the KV cache gauges are the bytes the engine's pools hold."""
    from dflash_trt.server import create_app

    llm = LLM(target=pair[0], draft=pair[1], max_batch_size=4, max_seq_len=256, draft_len_policy="fixed")
    label = f"model_name={NAME}"

    def spec(m):
        pos = [m.get(f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},position={i}}}") for i in range(7)]
        return [m[f"vllm:spec_decode_num_{k}_total{{{label}}}"] for k in ("drafts", "draft_tokens",
                                                                           "accepted_tokens")], pos

    with ThreadServer(create_app(llm, served_model_name=NAME)) as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
        m = scrape(base)
        before, pos0 = spec(m)
        assert None not in pos0 and f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},position=7}}" \
            not in m  # positions 0..K-1 (K = block_size - 1), as vLLM lists them
        stats, lengths = [], (30, 40, 50)
        for n, prompt in zip(lengths, ("count me", [11, 11, 11], [30, 31, 32, 33])):
            r = c.completions.create(model=NAME, prompt=prompt, max_tokens=n, temperature=0,
                                     extra_body={"ignore_eos": True})
            stats.append(r.model_extra["dflash"])
        m = scrape(base)
        after, pos1 = spec(m)
        one = c.completions.create(model=NAME, prompt="one", max_tokens=1, temperature=0).model_extra["dflash"]
    drafts, drafted, accepted = (sum(s[k] for s in stats) for k in ("drafts", "drafted", "accepted"))
    assert drafts > 0 and 0 < accepted < drafted
    assert [a - b for a, b in zip(after, before)] == [drafts, drafted, accepted]
    per_pos = [sum(s["accepted_per_position"][i] for s in stats if i < len(s["accepted_per_position"]))
               for i in range(7)]
    assert [a - b for a, b in zip(pos1, pos0)] == per_pos and sum(per_pos) == accepted
    assert per_pos == sorted(per_pos, reverse=True) and per_pos[0] < drafts  # some steps accepted nothing
    for n, s in zip(lengths, stats):
        assert s["tau"] == pytest.approx(1 + s["accepted"] / s["drafts"], abs=1e-3)
        # fixed K drafts every step but one with a single token left (K <= tokens left - 1): that one counts too
        assert s["drafts"] <= s["steps"] <= s["drafts"] + 1 and s["steps"] + s["accepted"] == n - 1
    assert one == {"steps": 0, "drafts": 0, "drafted": 0, "accepted": 0, "accepted_per_position": [], "tau": None,
                   "acceptance_rate": None}
    eng = llm.engine
    for model, caches in (("target", eng.runner.target_caches), ("drafter", eng.proposer.caches)):
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in caches)
        assert m[f"dflash_kv_cache_bytes{{model={model}}}"] == nbytes > 0
        per_token = sum(k[0, 0].numel() * k.element_size() + v[0, 0].numel() * v.element_size() for k, v in caches)
        assert m[f"dflash_kv_cache_bytes_per_token{{model={model}}}"] == per_token


# -- a full queue answers 429 (an in-process server from create_app) -------------------------------------------
class ThreadServer:
    def __init__(self, app):
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        wait_until(lambda: self.server.started, 30, "in-process server start")
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=15)


def test_queue_full_gives_429(pair):
    from dflash_trt.server import create_app

    t, d = pair
    app = create_app(LLM(target=t, draft=d, max_batch_size=1, max_seq_len=MAX_SEQ_LEN), max_queue=1,
                     served_model_name=NAME)
    with ThreadServer(app) as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30)
        stream = c.completions.create(model=NAME, prompt="hog", max_tokens=MAX_SEQ_LEN - 10, temperature=0,
                                      stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))  # the first request holds the only slot
        with pytest.raises(openai.RateLimitError) as e:
            c.completions.create(model=NAME, prompt="me too", max_tokens=5)
        assert e.value.status_code == 429 and e.value.response.headers["retry-after"] == "1"
        assert e.value.body["type"] == "rate_limit_error" and "max_queue 1" in e.value.body["message"]
        stream.close()  # disconnect: the slot frees
        wait_until(lambda: all_blocks_free(base), 5, "slot freed")
        assert c.completions.create(model=NAME, prompt="me too", max_tokens=5,
                                    temperature=0).choices[0].finish_reason in ("stop", "length")
        assert scrape(base)["dflash_requests_rejected_total{status=429}"] == 1


def test_cli_errors_are_one_line(pair, tmp_path, capsys):
    from dflash_trt.server.cli import main

    assert main(["--target", str(tmp_path / "missing"), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "not found" in err and "\n" not in err
    # one process cannot be TP=2: the one-line hint to launch it under mpirun
    assert main(["--target", pair[0], "--draft", pair[1], "--tp-size", "2", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: tp_size is 2 but 1 rank(s) are running: launch with `mpirun -n 2") and "\n" not in err


# -- --backend trtllm -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(pair, tmp_path_factory):
    from dflash_trt.builder.cli import main as build_main

    out = str(tmp_path_factory.mktemp("engine") / "eng")
    assert build_main(["--target", pair[0], "--draft", pair[1], "--output", out, "--tp-size", "2",
                       "--max-seq-len", "1024", "--max-batch-size", "16", "--quiet"]) == 0
    return out


def test_trtllm_command_line_and_yaml(engine, tmp_path):
    from dflash_trt.server import trtllm

    rec = json.load(open(os.path.join(engine, "engine.json")))
    plan = trtllm.launch_plan(engine, host="0.0.0.0", port=8000)
    yaml_path = os.path.join(engine, "trtllm", "dflash.yaml")
    assert plan.argv == ["trtllm-serve", "serve", os.path.join(engine, "target"), "--backend", "pytorch",
                         "--tp_size", "2", "--max_seq_len", "1024", "--max_batch_size", "16",
                         "--max_num_tokens", str(rec["max_num_tokens"]), "--config", yaml_path,
                         "--host", "0.0.0.0", "--port", "8000"]
    assert not plan.rewritten and plan.config_path == yaml_path and plan.config_text == open(yaml_path).read()
    assert trtllm.launch_plan(engine, host="0.0.0.0", port=8000, tp_size=8).argv == \
        [*plan.argv[:6], "8", *plan.argv[7:]]  # --tp-size overrides the engine's (flag only: not in the YAML)

    # the same command as the engine's own trtllm/serve.sh (trtllm-serve stubbed to print its arguments)
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "trtllm-serve").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    (stub / "trtllm-serve").chmod(0o755)
    env = dict(os.environ, PATH=f"{stub}:{os.environ['PATH']}", HOST="0.0.0.0", PORT="8000", TMPDIR=str(tmp_path))
    r = subprocess.run(["bash", os.path.join(engine, "trtllm", "serve.sh")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == plan.argv[1:]

    # a moved engine directory (a container mount) is served with a copy naming its drafter where it now is
    yaml = pytest.importorskip("yaml")
    moved = str(tmp_path / "mnt" / "engine")
    shutil.copytree(engine, moved)
    plan = trtllm.launch_plan(moved, host="127.0.0.1", port=9000, max_batch_size=4, tmpdir=str(tmp_path))
    assert plan.rewritten and plan.config_path.startswith(str(tmp_path)) and plan.config_path != yaml_path
    assert plan.argv[2] == os.path.join(moved, "target") and plan.argv[plan.argv.index("--config") + 1] == \
        plan.config_path
    assert plan.argv[plan.argv.index("--max_batch_size") + 1] == "4"
    y = yaml.safe_load(plan.config_text)
    assert open(plan.config_path).read() == plan.config_text
    assert y["speculative_config"]["speculative_model"] == os.path.join(moved, "draft")
    assert y["max_batch_size"] == 4 and y["cuda_graph_config"]["max_batch_size"] == 4
    assert y == {**yaml.safe_load(open(yaml_path)), "max_batch_size": 4,
                 "cuda_graph_config": {"enable_padding": True, "max_batch_size": 4},
                 "speculative_config": {**yaml.safe_load(open(yaml_path))["speculative_config"],
                                        "speculative_model": os.path.join(moved, "draft")}}


def test_trtllm_cli(engine, monkeypatch, capsys):
    from dflash_trt.server import cli, trtllm

    monkeypatch.delenv("DFLASH_HOST", raising=False)
    monkeypatch.delenv("DFLASH_PORT", raising=False)
    if trtllm.importlib.util.find_spec("tensorrt_llm") is None:  # here: a one-line error, exit 2
        assert cli.main([engine, "--backend", "trtllm"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --backend trtllm needs TensorRT-LLM") and "\n" not in err
    assert cli.main([engine, "--backend", "trtllm", "--dry-run", "--port", "8123"]) == 0
    assert capsys.readouterr().out.strip() == trtllm.launch_plan(engine, host="127.0.0.1", port=8123).command()
    # where TensorRT-LLM is installed: exec of exactly that command, extra flags after `--` passed through
    ran = []
    monkeypatch.setattr(trtllm, "check_available", lambda: None)
    monkeypatch.setattr(trtllm, "exec_plan", lambda plan: ran.append(plan.argv))
    assert cli.main([engine, "--backend", "trtllm", "--host", "0.0.0.0", "--", "--log_level", "info"]) == 0
    assert ran == [trtllm.launch_plan(engine, host="0.0.0.0", port=8000).argv + ["--log_level", "info"]]
    for argv, needle in (([engine, "--backend", "trtllm", "--api-key", "k"], "--api-key"),
                         (["--target", engine, "--backend", "trtllm"], "ENGINE_DIR"),
                         ([os.path.join(engine, "target"), "--backend", "trtllm"], "not a dflash-build engine")):
        assert cli.main(argv) == 2
        assert needle in capsys.readouterr().err
