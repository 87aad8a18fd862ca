"""dflash-serve operations on a real server process (127.0.0.1, a tiny pair): SIGTERM drains (503 with Retry-After
for new requests, running ones finish or are cut with an error event and [DONE], the exit status says which)."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

import tiny
from serving import free_port, wait_healthy

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny.accepting_pair(str(tmp_path_factory.mktemp("ops")))


class Server:
    """`python -m dflash_trt.server.cli ...` as a user starts it, its stderr in a file."""

    def __init__(self, args: list[str], log_path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("DFLASH_TEST_THREADS", "1"))
        env.pop("DFLASH_API_KEY", None)
        with open(log_path, "w") as f:
            self.proc = subprocess.Popen([sys.executable, "-m", "dflash_trt.server.cli", *args, "--host",
                                          "127.0.0.1", "--port", str(self.port), "--log-level", "warning"],
                                         stdout=f, stderr=subprocess.STDOUT, env=env)
        wait_healthy(self.base, self.proc, self.log)

    def log(self) -> str:
        return open(self.log_path).read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def stream_events(base: str, body: dict, out: list, started: threading.Event):
    """Reads one streamed completion into `out` (the data lines), setting `started` at its third event."""
    with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(line[6:])
                if len(out) == 3:
                    started.set()
    started.set()


def start_stream(base, body):
    out, started = [], threading.Event()
    t = threading.Thread(target=stream_events, args=(base, body, out, started), daemon=True)
    t.start()
    assert started.wait(60)
    return t, out


def assert_refused_while_draining(base):
    r = httpx.post(f"{base}/v1/completions", json={"prompt": "late", "max_tokens": 2}, timeout=10)
    assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
    assert r.json()["error"]["code"] == "shutting_down"
    assert httpx.get(f"{base}/health", timeout=10).json() == {"status": "draining"}


def test_sigterm_drains_running_requests_then_exits_zero(pair, tmp_path):
    s = Server(["--target", pair[0], "--draft", pair[1], "--max-seq-len", "2048", "--drain-timeout", "120"],
               tmp_path / "log")
    try:  # long enough to be still running when the late request arrives, on a fast CPU too
        t, out = start_stream(s.base, {"prompt": "drain me", "max_tokens": 1800, "temperature": 0,
                                       "ignore_eos": True})
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert_refused_while_draining(s.base)
        t.join(120)
        assert s.proc.wait(60) == 0, s.log()
    finally:
        s.stop()
    assert out[-1] == "[DONE]"
    last = json.loads(out[-2])
    assert last["choices"][0]["finish_reason"] == "length" and last["dflash"]["steps"] > 0
    assert "".join(json.loads(e)["choices"][0]["text"] for e in out[:-1]) != ""
    log = s.log()
    assert "draining 1 running request(s)" in log and "cut" not in log and "Traceback" not in log, log


def test_sigterm_cuts_streams_at_the_deadline_and_exits_nonzero(pair, tmp_path):
    s = Server(["--target", pair[0], "--draft", pair[1], "--max-seq-len", "2048", "--drain-timeout", "1"],
               tmp_path / "log")
    body = {"prompt": "never ends", "max_tokens": 2000, "temperature": 0, "ignore_eos": True}
    try:
        streams = [start_stream(s.base, body) for _ in range(2)]
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert_refused_while_draining(s.base)
        for t, _ in streams:
            t.join(60)
        assert s.proc.wait(60) == 1, s.log()
    finally:
        s.stop()
    ids = set()
    for _, out in streams:
        assert out[-1] == "[DONE]", out[-3:]
        err = json.loads(out[-2])["error"]
        assert err["code"] == "shutting_down" and "shut down before the request finished" in err["message"]
        assert all("error" not in json.loads(e) for e in out[:-2])  # tokens streamed until the cut
        ids.add(json.loads(out[0])["id"])
    log = s.log()
    cut_lines = [line for line in log.splitlines() if " at the drain deadline after " in line]
    assert len(cut_lines) == 2 and all(any(i in line for line in cut_lines) for i in ids), log
    assert "2 request(s) cut at the drain deadline" in log and "Traceback" not in log, log


def test_steps_count_every_decoding_step_even_when_eos_drops_accepted_drafts(pair):
    """RequestOutput.steps = the engine iterations that decoded the request (alone here: all but its prefill),
    drafted or not, also when a stop token ends it inside a block of accepted drafts (the rest are dropped)."""
    from dflash_trt import LLM, SamplingParams

    llm = LLM(target=pair[0], draft=pair[1], max_batch_size=1, draft_len_policy="fixed")
    free = llm.generate(["count me"], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))[0]
    # drafts: the target's own continuation cut at a position that moves every step (accepted lengths 0..K)
    llm.engine.proposer.propose = tiny.as_propose(tiny.OracleDrafter(lambda seq: free.token_ids))
    dropped = 0
    for tok in [t for t in dict.fromkeys(free.token_ids) if free.token_ids.index(t) > 0]:
        its = len(llm.engine.metrics.iterations)
        o = llm.generate(["count me"], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True,
                                                            stop_token_ids=[tok]))[0]
        assert o.token_ids == free.token_ids[:free.token_ids.index(tok) + 1]
        assert o.steps == len(llm.engine.metrics.iterations) - its - 1, tok
        assert o.tau == pytest.approx(1 + o.accepted / o.num_drafts)
        dropped += o.steps + o.accepted > len(o.token_ids) - 1  # accepted drafts past the stop token
    assert dropped  # the case that counting from the output's length alone gets wrong


def test_streaming_soak_with_disconnects_equals_llm_generate(pair):
    """benchmarks/serve_soak.py's check against a real server (uvicorn on 127.0.0.1, in this process): 12
    concurrent streams with a shared system prompt, every 4th client leaving after 3 events; no errors, every
    remaining stream ends with [DONE] and equals LLM.generate, the cache is back to idle."""
    import importlib.util

    import uvicorn

    from dflash_trt import LLM, SamplingParams
    from dflash_trt.server import create_app

    spec = importlib.util.spec_from_file_location("serve_soak", os.path.join(os.path.dirname(__file__), "..",
                                                                             "benchmarks", "serve_soak.py"))
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    plist = soak.prompts(12)
    llm = LLM(target=pair[0], draft=pair[1], max_batch_size=6, max_seq_len=256)
    want = [o.text for o in llm.generate(plist, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))]
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(llm), host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        end = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < end
            time.sleep(0.05)
        fig = soak.soak(f"http://127.0.0.1:{port}", plist, 24, want, disconnect_every=4)
    finally:
        server.should_exit = True
        t.join(30)
    assert (fig["completed"], fig["left"], fig["errors"]) == (9, 3, 0) and fig["outputs_equal_llm_generate"]
