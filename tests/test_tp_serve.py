"""`mpirun -n 2 dflash-serve`: rank 0 serves HTTP on 127.0.0.1, rank 1 executes every engine step with it.

Concurrent greedy completions, chat, streaming and seeded sampling give the TP=1 engine's own outputs; a client
that leaves mid-stream has its request aborted on both ranks; an idle server outlives the followers' timeout
(heartbeats); a taken port is one error line from rank 0 and every rank exits; SIGTERM to rank 0, or Ctrl-C to
mpirun (forwarded to every rank), shuts all ranks down with exit code 0; a hung rank 0 does not keep rank 1
waiting past DFLASH_TP_TIMEOUT.
"""
import concurrent.futures
import os
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pytest

import tiny
from serving import free_port, wait_healthy
from dflash_trt import LLM, SamplingParams

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytestmark = [pytest.mark.mpi, pytest.mark.skipif(shutil.which("mpirun") is None,
                                                  reason="mpirun not on PATH (pip install mpi4py mpich)")]

NAME = "tiny-tp"
MAX_SEQ_LEN = 512
LEASE_S = 3  # DFLASH_TP_TIMEOUT for the servers here: short, so the tests see it expire (or not)
RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny.accepting_pair(str(tmp_path_factory.mktemp("tpserve")))  # 4 heads, 2 kv heads


@pytest.fixture(scope="module")
def ref(pair):
    t, d = pair
    return LLM(target=t, draft=d, max_seq_len=MAX_SEQ_LEN, max_batch_size=4)


class MPIServer:
    """`mpirun -n 2 dflash-serve ...` as a user starts it, with its ranks' pids."""

    def __init__(self, pair, log_path, port=None):
        t, d = pair
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        exe = shutil.which("dflash-serve")
        cmd = [exe] if exe else [sys.executable, "-m", "dflash_trt.server.cli"]
        # every step drafts (--draft-len-policy fixed): the tiny drafter's pass costs ~2.5 target passes, so the
        # adaptive policy rightly drafts little here, and the ranks' speculative steps are what is under test
        self.argv = ["mpirun", "-n", "2", *cmd, "--target", t, "--draft", d, "--port", str(self.port),
                     "--max-batch-size", "4", "--max-seq-len", str(MAX_SEQ_LEN), "--served-model-name", NAME,
                     "--draft-len-policy", "fixed", "--log-level", "warning"]
        env = dict(os.environ, OMP_NUM_THREADS="1", DFLASH_TP_TIMEOUT=str(LEASE_S))
        env.pop("DFLASH_API_KEY", None)
        self.log = open(log_path, "w")
        # a session of its own: whatever is left at the end is killed by this group id, nothing else
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.ranks: dict[int, int] = {}

    def text(self) -> str:
        self.log.flush()
        return open(self.log_path).read()

    def rank_pids(self) -> dict[int, int]:
        """{rank: pid} of the dflash-serve processes of this server (by port), read from /proc."""
        out = {}
        needle = f"\0--port\0{self.port}\0".encode()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
                if needle not in cmd or b"dflash" not in cmd or b"mpi" in cmd.split(b"\0")[0]:
                    continue
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            except OSError:
                continue
            for v in RANK_VARS:
                if v.encode() in env:
                    out[int(env[v.encode()])] = int(pid)
                    break
        return out

    def wait_ready(self, timeout=180):
        wait_healthy(self.base, self.proc, self.text, timeout, poll=0.3, what="mpirun")
        self.ranks = self.rank_pids()
        assert sorted(self.ranks) == [0, 1], (self.ranks, self.text())
        return self

    def alive(self) -> list[int]:
        return [r for r, pid in self.ranks.items() if os.path.exists(f"/proc/{pid}") and not _zombie(pid)]

    def wait_exit(self, timeout=60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"mpirun still running {timeout} s later: {self.text()}") from None

    def close(self):
        if self.proc.poll() is None:
            for pid in self.ranks.values():  # a stopped rank must run again to die of anything but SIGKILL
                try:
                    os.kill(pid, signal.SIGCONT)
                except OSError:
                    pass
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_until(cond, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def metrics(base: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=10).text):
        for s in fam.samples:
            out[s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))] = s.value
    return out


def all_blocks_free(base: str) -> bool:
    m = metrics(base)
    return m["dflash_kv_cache_blocks_free"] == m["dflash_kv_cache_blocks_total"] and \
        m["dflash_num_requests_unfinished"] == 0


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


def check_same(r, want) -> int:
    """An OpenAI completion or chat answer (non-streaming) against the TP=1 RequestOutput; its drafted tokens.

    Tokens only: how many steps and drafts a request takes may depend on what it was batched with (draft
    lengths adapt to the batch), its tokens never do. The char tokenizer maps text to tokens one to one."""
    c = r.choices[0]
    text = c.text if r.object == "text_completion" else c.message.content
    assert text == want.text and c.finish_reason == want.finish_reason
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(want.prompt_token_ids), len(want.token_ids))
    return r.model_extra["dflash"]["drafted"]


def test_mpirun_serve_equals_tp1(pair, ref, tmp_path):
    srv = MPIServer(pair, tmp_path / "serve.log")
    try:
        srv.wait_ready()
        c = openai.OpenAI(base_url=f"{srv.base}/v1", api_key="unused", max_retries=0, timeout=120)
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something"}]
        stream_msgs = [{"role": "user", "content": "Stream a chat"}]
        free = ref.generate(["Stop test"], greedy(40, ignore_eos=True))[0].text
        stop = free[5:7]
        want = {
            "text": ref.generate(["Hello there, general"], greedy(40))[0],
            "ids": ref.generate([[20, 21, 22, 40, 41]], greedy(30, ignore_eos=True))[0],
            "chat": ref.generate([msgs], greedy(30), chat=True)[0],
            "stream": ref.generate(["Stream me"], greedy(60, ignore_eos=True))[0],
            "stream_chat": ref.generate([stream_msgs], greedy(40), chat=True)[0],
            "seeded": ref.generate(["Once upon"], SamplingParams(max_tokens=30, temperature=0.9, top_p=0.95,
                                                                 seed=1234, ignore_eos=True))[0],
        }

        def stream_text(chunks, chat):
            return "".join((ch.choices[0].delta.content or "") if chat else ch.choices[0].text
                           for ch in chunks if ch.choices)

        jobs = {
            "text": lambda: c.completions.create(model=NAME, prompt="Hello there, general", max_tokens=40,
                                                 temperature=0),
            "ids": lambda: c.completions.create(model=NAME, prompt=[20, 21, 22, 40, 41], max_tokens=30,
                                                temperature=0, extra_body={"ignore_eos": True}),
            "chat": lambda: c.chat.completions.create(model=NAME, messages=msgs, max_tokens=30, temperature=0),
            "stream": lambda: list(c.completions.create(model=NAME, prompt="Stream me", max_tokens=60,
                                                        temperature=0, stream=True,
                                                        stream_options={"include_usage": True},
                                                        extra_body={"ignore_eos": True})),
            "stream_chat": lambda: list(c.chat.completions.create(model=NAME, messages=stream_msgs, max_tokens=40,
                                                                  temperature=0, stream=True)),
            "seeded": lambda: c.completions.create(model=NAME, prompt="Once upon", max_tokens=30, temperature=0.9,
                                                   top_p=0.95, seed=1234, extra_body={"ignore_eos": True}),
            "stop": lambda: c.completions.create(model=NAME, prompt="Stop test", max_tokens=40, temperature=0,
                                                 stop=[stop], extra_body={"ignore_eos": True}),
        }
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:  # all in flight together: batched steps
            got = {k: f.result() for k, f in {k: pool.submit(fn) for k, fn in jobs.items()}.items()}
        assert sum(check_same(got[k], want[k]) for k in ("text", "ids", "chat", "seeded")) > 0  # speculative
        chunks = got["stream"]
        assert stream_text(chunks, False) == want["stream"].text and len(chunks) > 3
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 60
        final = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        assert len(final) == 1 and final[0].choices[0].finish_reason == "length"
        chunks = got["stream_chat"]
        assert stream_text(chunks, True) == want["stream_chat"].text
        assert chunks[-1].choices[0].finish_reason == want["stream_chat"].finish_reason
        assert got["stop"].choices[0].text == free[:free.find(stop)]
        assert got["stop"].choices[0].finish_reason == "stop"
        wait_until(lambda: all_blocks_free(srv.base), 10, "blocks freed after the batch")

        # a client leaving mid-stream: the abort reaches rank 1 too (else its engine would run one more request
        # than rank 0's, and their next collectives would not match)
        aborts = metrics(srv.base).get("dflash_requests_total{finish_reason=abort}", 0)
        body = {"model": NAME, "prompt": "go on", "max_tokens": MAX_SEQ_LEN - 10, "temperature": 0, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", f"{srv.base}/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert sum(1 for _ in zip(range(6), lines)) == 6
        wait_until(lambda: all_blocks_free(srv.base), 10, "blocks freed after a streaming disconnect")
        assert metrics(srv.base)["dflash_requests_total{finish_reason=abort}"] == aborts + 1

        # idle for longer than the followers' timeout: rank 0's heartbeats keep rank 1 waiting
        time.sleep(LEASE_S + 2)
        assert srv.alive() == [0, 1], srv.text()
        check_same(c.completions.create(model=NAME, prompt="Hello there, general", max_tokens=40, temperature=0),
                   want["text"])

        # a second server on the same port: one error line from rank 0, and both of its ranks exit
        t0 = time.monotonic()
        r = subprocess.run(srv.argv, capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert r.returncode != 0
        errors = [x for x in (r.stdout + r.stderr).splitlines() if x.startswith("error:")]
        assert len(errors) == 1 and f"cannot listen on 127.0.0.1:{srv.port}" in errors[0], r.stdout + r.stderr
        assert time.monotonic() - t0 < 60

        # SIGTERM to rank 0 alone: it shuts down gracefully and releases rank 1; everything exits 0
        os.kill(srv.ranks[0], signal.SIGTERM)
        assert srv.wait_exit() == 0, srv.text()
        assert srv.alive() == []
        log = srv.text()
        assert "Traceback" not in log and "BAD TERMINATION" not in log, log
    finally:
        srv.close()


@pytest.mark.parametrize("how", ["ctrl-c", "rank0-hangs"])
def test_mpirun_serve_shutdown(pair, ref, tmp_path, how):
    srv = MPIServer(pair, tmp_path / "serve.log")
    try:
        srv.wait_ready()
        want = ref.generate(["Hello there, general"], greedy(40))[0]
        r = httpx.post(f"{srv.base}/v1/completions", json={"model": NAME, "prompt": "Hello there, general",
                                                           "max_tokens": 40, "temperature": 0}, timeout=120)
        assert r.json()["choices"][0]["text"] == want.text
        t0 = time.monotonic()
        if how == "ctrl-c":  # mpirun forwards it to every rank; rank 1 waits for rank 0's shutdown message
            srv.proc.send_signal(signal.SIGINT)
            assert srv.wait_exit() == 0, srv.text()
            log = srv.text()
            assert "Traceback" not in log and "BAD TERMINATION" not in log, log
        else:  # rank 0 stops answering: rank 1 gives up after the lease, and mpirun then ends rank 0
            os.kill(srv.ranks[0], signal.SIGSTOP)
            assert srv.wait_exit() != 0
            assert f"dflash: rank 1: no message from rank 0 for {LEASE_S:g} s" in srv.text(), srv.text()
            assert LEASE_S <= time.monotonic() - t0 < LEASE_S + 30
        wait_until(lambda: srv.alive() == [], 10, "all ranks gone")
    finally:
        srv.close()
