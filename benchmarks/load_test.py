"""Load test of a running dflash-serve on 127.0.0.1: concurrent streaming clients, some leaving mid-stream.

    dflash-serve --target DIR --draft DIR --port 8000 &        # or any dflash-serve
    python benchmarks/load_test.py --port 8000 [--clients 64] [--rounds 3] [--max-tokens 128]

Each round starts `clients` streaming /v1/completions requests at once, with random prompt lengths and random
max_tokens (ignore_eos, so every length is exercised); a quarter of them disconnect after a random number of
events. Reported: HTTP status counts (any 5xx or in-stream error fails the run), 429s, time to first token and
total latency percentiles, tokens/s. After every round it waits for the server to drain and reads /metrics:
every KV cache block must be free, no request running, and the server's resident memory must not grow from the
end of round 1 to the end of the last round by more than --rss-tolerance-mb. Exit code 0 only if all holds.
Bounded: at most 256 clients x 10 rounds, --max-seconds per round. Talks to 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

import httpx

HOST = "127.0.0.1"
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


def metrics(base: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(httpx.get(f"{base}/metrics", timeout=10).text):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = s.value
    return out


async def one_client(http: httpx.AsyncClient, rng: random.Random, model: str, args, stats: dict) -> None:
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, args.max_prompt_words)))
    body = {"model": model, "prompt": prompt, "max_tokens": rng.randint(1, args.max_tokens), "stream": True,
            "temperature": rng.choice([0.0, 0.7]), "seed": rng.randrange(1 << 30), "ignore_eos": True}
    leave_after = rng.randint(1, 8) if rng.random() < args.disconnect_fraction else None
    t0 = time.perf_counter()
    first = None
    events = 0
    try:
        async with http.stream("POST", "/v1/completions", json=body) as r:
            stats["status"][r.status_code] = stats["status"].get(r.status_code, 0) + 1
            if r.status_code != 200:
                await r.aread()
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                ev = json.loads(data)
                if "error" in ev:
                    stats["stream_errors"] += 1
                    return
                events += 1
                choice = ev["choices"][0] if ev["choices"] else {}
                if first is None and choice.get("text"):
                    first = time.perf_counter()
                if leave_after is not None and events >= leave_after and not choice.get("finish_reason"):
                    stats["disconnected"] += 1
                    return  # leaving the `async with` closes the connection mid-stream
        end = time.perf_counter()
        stats["latency"].append(end - t0)
        if first is not None:
            stats["ttft"].append(first - t0)
        stats["completed"] += 1
    except httpx.HTTPError as e:
        stats["transport_errors"].append(f"{type(e).__name__}: {e}")


async def run_round(base: str, model: str, args, seed: int) -> dict:
    rng = random.Random(seed)
    stats = {"status": {}, "stream_errors": 0, "disconnected": 0, "completed": 0, "latency": [], "ttft": [],
             "transport_errors": [], "timed_out": False}
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.clients + 4, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(args.max_seconds, connect=10)) as http:
        rngs = [random.Random(rng.random()) for _ in range(args.clients)]
        try:
            await asyncio.wait_for(asyncio.gather(*(one_client(http, r, model, args, stats) for r in rngs)),
                                   timeout=args.max_seconds)
        except asyncio.TimeoutError:
            stats["timed_out"] = True
    return stats


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def drained(base: str, timeout: float = 30.0) -> dict:
    end = time.monotonic() + timeout
    while True:
        m = metrics(base)
        if m.get("dflash_num_requests_unfinished", 0) == 0 and m.get("dflash_num_requests_running", 0) == 0:
            return m
        if time.monotonic() > end:
            return m
        time.sleep(0.1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key")
    p.add_argument("--model", help="model id (default: the first of /v1/models)")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-prompt-words", type=int, default=48)
    p.add_argument("--disconnect-fraction", type=float, default=0.25)
    p.add_argument("--max-seconds", type=float, default=300, help="limit per round")
    p.add_argument("--rss-tolerance-mb", type=float, default=64.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not (1 <= args.clients <= 256 and 1 <= args.rounds <= 10):
        p.error("--clients must be in 1..256 and --rounds in 1..10")
    base = f"http://{HOST}:{args.port}"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    model = args.model or httpx.get(f"{base}/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
    print(f"{base}: model {model}, {args.clients} streaming clients x {args.rounds} rounds, max_tokens <= "
          f"{args.max_tokens}, {args.disconnect_fraction:.0%} disconnect mid-stream")
    failures, rss = [], []
    all_lat, all_ttft, fivexx = [], [], 0
    for rnd in range(args.rounds):
        before = metrics(base)
        t0 = time.perf_counter()
        s = asyncio.run(run_round(base, model, args, args.seed * 1000 + rnd))
        wall = time.perf_counter() - t0
        m = drained(base)
        gen = m["dflash_generation_tokens_total"] - before["dflash_generation_tokens_total"]
        r5 = sum(n for code, n in s["status"].items() if code >= 500)
        fivexx += r5
        all_lat += s["latency"]
        all_ttft += s["ttft"]
        rss.append(m.get("process_resident_memory_bytes", float("nan")))
        free, total = m["dflash_kv_cache_blocks_free"], m["dflash_kv_cache_blocks_total"]
        aborted = (m.get("dflash_requests_total{finish_reason=abort}", 0)
                   - before.get("dflash_requests_total{finish_reason=abort}", 0))
        print(f"round {rnd + 1}: {wall:6.2f} s, status {dict(sorted(s['status'].items()))}, completed "
              f"{s['completed']}, disconnected {s['disconnected']} (server aborts {aborted:.0f}), stream errors "
              f"{s['stream_errors']}, transport errors {len(s['transport_errors'])}, {gen:.0f} tokens "
              f"({gen / wall:.0f} tok/s), TTFT p50 {pct(s['ttft'], 50) * 1e3:.0f} ms p99 "
              f"{pct(s['ttft'], 99) * 1e3:.0f} ms, latency p50 {pct(s['latency'], 50):.2f} s p99 "
              f"{pct(s['latency'], 99):.2f} s; KV blocks free {free:.0f}/{total:.0f}, RSS {rss[-1] / 2**20:.0f} MiB")
        if r5 or s["stream_errors"]:
            failures.append(f"round {rnd + 1}: {r5} HTTP 5xx, {s['stream_errors']} in-stream errors")
        if s["timed_out"]:
            failures.append(f"round {rnd + 1}: not done within --max-seconds {args.max_seconds}")
        if s["transport_errors"]:
            failures.append(f"round {rnd + 1}: transport errors, e.g. {s['transport_errors'][0]}")
        if free != total or m["dflash_num_requests_running"] or m["dflash_num_requests_unfinished"]:
            failures.append(f"round {rnd + 1}: after draining, {total - free:.0f} KV blocks still in use, "
                            f"{m['dflash_num_requests_running']:.0f} running")
    if len(rss) >= 2 and rss[-1] - rss[0] > args.rss_tolerance_mb * 2**20:
        failures.append(f"server RSS grew {(rss[-1] - rss[0]) / 2**20:.0f} MiB from round 1 to round {len(rss)}")
    print(f"all rounds: 5xx {fivexx}; TTFT p50/p90/p99 {pct(all_ttft, 50) * 1e3:.0f}/{pct(all_ttft, 90) * 1e3:.0f}/"
          f"{pct(all_ttft, 99) * 1e3:.0f} ms; latency p50/p90/p99 {pct(all_lat, 50):.2f}/{pct(all_lat, 90):.2f}/"
          f"{pct(all_lat, 99):.2f} s; RSS per round (MiB) {[round(r / 2**20) for r in rss]}")
    for f in failures:
        print("FAIL:", f)
    print("OK" if not failures else f"{len(failures)} failure(s)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
