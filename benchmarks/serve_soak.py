"""A streaming soak of dflash-serve: many concurrent clients, each reading server-sent events to the end.

Every stream must end with [DONE] after one final chunk, no request may fail, every greedy output must equal
`LLM.generate` on the same pair (run here first, in one batch), and once the clients are done the server's cache
must be back to idle (every block free, nothing running). Some clients may leave mid-stream (--disconnect-every):
their requests are aborted and must free their blocks too. Prompts share a system prompt, as chat traffic does.

    python benchmarks/serve_soak.py --clients 64 --max-tokens 48           # the embedded SmolLM2-135M pair
    python benchmarks/serve_soak.py --target T --draft D --clients 64

`soak(base, ...)` is the part a test calls against a server it started itself.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import httpx

SYSTEM = "You are a terse assistant. Answer in one short paragraph, without lists."
TOPICS = ["GPUs", "rivers", "compilers", "bread", "tides", "chess", "volcanoes", "jazz", "bees", "glaciers",
          "maps", "clocks", "sailing", "ferns", "radio", "origami"]


def prompts(n: int) -> list[str]:
    """n completion prompts sharing a system-prompt prefix."""
    return [f"{SYSTEM}\nUser: Say something about {TOPICS[i % len(TOPICS)]} (request {i}).\nAssistant:"
            for i in range(n)]


async def _client(http: httpx.AsyncClient, base: str, prompt: str, max_tokens: int, leave_after: int | None,
                  headers: dict) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True}
    t0, first, events, text = time.perf_counter(), None, [], []
    async with http.stream("POST", f"{base}/v1/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if line[6:] == "[DONE]":
                break
            ev = json.loads(line[6:])
            if "error" in ev:
                return {"error": ev["error"]["message"]}
            if first is None:
                first = time.perf_counter()
            text.append(ev["choices"][0]["text"])
            if leave_after is not None and len(events) >= leave_after:
                return {"left": True}  # closing the stream here is the disconnect
    if not events or events[-1] != "[DONE]":
        return {"error": f"the stream ended without [DONE] after {len(events)} events"}
    final = json.loads(events[-2])
    return {"text": "".join(text), "finish_reason": final["choices"][0]["finish_reason"], "ttft": first - t0,
            "latency": time.perf_counter() - t0, "dflash": final.get("dflash")}


def _scrape(base: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=30).text):
        for s in fam.samples:
            if not s.labels:
                out[s.name] = s.value
            elif s.name.startswith("vllm:prefix_cache_"):  # one model_name label
                out[s.name] = out.get(s.name, 0) + s.value
    return out


async def _run(base, plist, max_tokens, leave, headers, timeout):
    limits = httpx.Limits(max_connections=len(plist) + 8, max_keepalive_connections=len(plist) + 8)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        return await asyncio.gather(*(_client(http, base, p, max_tokens, leave[i], headers)
                                      for i, p in enumerate(plist)))


def soak(base: str, plist: list[str], max_tokens: int, want: list[str] | None = None, disconnect_every: int = 0,
         api_key: str | None = None, timeout: float = 600.0, idle_wait_s: float = 10.0) -> dict:
    """All of `plist` at once, one streaming client each; client i leaves after 3 events when disconnect_every
    divides i + 1. Returns the figures; raises AssertionError on any failure (an error, a stream without [DONE],
    an output unlike `want`, a cache not back to idle)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    leave = [3 if disconnect_every and (i + 1) % disconnect_every == 0 else None for i in range(len(plist))]
    m0 = _scrape(base)
    rss0 = m0.get("process_resident_memory_bytes", 0)
    t0 = time.perf_counter()
    results = asyncio.run(_run(base, plist, max_tokens, leave, headers, timeout))
    wall = time.perf_counter() - t0
    errors = [(i, r["error"]) for i, r in enumerate(results) if "error" in r]
    assert not errors, f"{len(errors)} of {len(results)} streams failed, first: {errors[0]}"
    done = [(i, r) for i, r in enumerate(results) if "text" in r]
    assert len(done) == sum(x is None for x in leave)
    if want is not None:
        wrong = [i for i, r in done if r["text"] != want[i]]
        assert not wrong, f"{len(wrong)} greedy outputs differ from LLM.generate, first: request {wrong[0]}"
    end = time.monotonic() + idle_wait_s
    while True:  # aborted requests free their blocks on the engine's next iteration
        m = _scrape(base)
        idle = (m["dflash_kv_cache_blocks_free"] == m["dflash_kv_cache_blocks_total"]
                and m["dflash_num_requests_running"] == 0 and m["dflash_num_requests_unfinished"] == 0)
        if idle or time.monotonic() > end:
            break
        time.sleep(0.1)
    assert idle, f"the cache is not back to idle: {m['dflash_kv_cache_blocks_free']} of " \
                 f"{m['dflash_kv_cache_blocks_total']} blocks free, {m['dflash_num_requests_running']} running"
    ttft = sorted(r["ttft"] for _, r in done)
    tokens = sum(max_tokens for _ in done)
    return {"clients": len(plist), "completed": len(done), "left": len(plist) - len(done), "errors": 0,
            "all_done_events": True, "outputs_equal_llm_generate": want is not None, "wall_s": round(wall, 2),
            "output_tok_per_s": round(tokens / wall, 1), "ttft_p50_s": round(ttft[len(ttft) // 2], 3),
            "ttft_max_s": round(ttft[-1], 3), "rss_before_mib": round(rss0 / 2**20, 1),
            "rss_after_mib": round(m.get("process_resident_memory_bytes", 0) / 2**20, 1),
            "prefix_cache_hit_tokens": int(m.get("vllm:prefix_cache_hits_total", 0)
                                           - m0.get("vllm:prefix_cache_hits_total", 0))}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="engine directory (default: the embedded pair)")
    p.add_argument("--target")
    p.add_argument("--draft")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--disconnect-every", type=int, default=8, help="every Nth client leaves after 3 events "
                   "(0: none)")
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--threads", type=int, help="torch CPU threads, here and in the server")
    p.add_argument("--rounds", type=int, default=1, help="soaks in a row against the same server (RSS after each "
                   "shows whether memory stays flat)")
    args = p.parse_args(argv)
    from dflash_trt import LLM, SamplingParams

    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    where = [args.model] if args.model else []
    where += ["--target", args.target] if args.target else []
    where += ["--draft", args.draft] if args.draft else []
    plist = prompts(args.clients)
    t0 = time.perf_counter()
    llm = LLM(args.model, target=args.target, draft=args.draft, max_batch_size=args.clients,
              max_seq_len=args.max_seq_len)
    want = [o.text for o in llm.generate(plist, SamplingParams(max_tokens=args.max_tokens, temperature=0,
                                                               ignore_eos=True))]
    print(f"reference: LLM.generate of {len(plist)} prompts in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    del llm
    port = _free_port()
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}))
    proc = subprocess.Popen([sys.executable, "-m", "dflash_trt.server.cli", *where, "--port", str(port),
                             "--max-batch-size", str(args.clients), "--max-seq-len", str(args.max_seq_len),
                             "--log-level", "warning"], env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"dflash-serve exited with {proc.returncode}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > end:
                raise SystemExit("dflash-serve did not start in 600 s")
            time.sleep(0.5)
        figs = [soak(base, plist, args.max_tokens, want, args.disconnect_every) for _ in range(args.rounds)]
        fig = dict(figs[-1], rounds=len(figs), rss_after_each_round_mib=[f["rss_after_mib"] for f in figs],
                   prefix_cache_hit_tokens_each_round=[f["prefix_cache_hit_tokens"] for f in figs])
    finally:
        proc.terminate()
        rc = proc.wait(120)
    fig["server_exit"] = rc
    print(json.dumps(fig))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
