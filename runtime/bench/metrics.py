"""Per-request records and the per-point summary of a sweep. Definitions (also written into every report):

- TTFT = first token time - arrival (add_request) time.
- TPOT = (finish - first token) / (output tokens - 1); undefined (left out) for one-token requests.
- latency = finish - arrival.
- tokens/s per user = mean over requests of 1 / TPOT (the decode speed one user sees; trtllm-bench's
  "per-user generation token throughput"). e2e tokens/s per user = mean over requests of output tokens / latency
  (trtllm-bench's "per user output throughput").
- aggregate tokens/s = all output tokens / wall, wall = last finish - first arrival; per device = / devices.
- tau = (accepted drafts + speculative steps) / speculative steps, pooled over the point's requests (tokens
  committed per target verify pass); None for autoregressive points.
- acceptance by position i (1-based) = steps whose draft token i was accepted / steps that drafted >= i tokens.
- percentiles: linear interpolation between order statistics (numpy's default).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

DEFINITIONS = {
    "ttft_s": "first token time - arrival time",
    "tpot_s": "(finish - first token) / (output tokens - 1); requests with one output token left out",
    "latency_s": "finish - arrival",
    "tokens_per_s_per_user": "mean over requests of 1 / TPOT",
    "e2e_tokens_per_s_per_user": "mean over requests of output tokens / latency",
    "aggregate_tokens_per_s": "all output tokens / wall; wall = last finish - first arrival",
    "aggregate_tokens_per_s_per_device": "aggregate_tokens_per_s / num_devices",
    "tau": "(accepted drafts + speculative steps) / speculative steps, pooled over requests",
    "acceptance_rate": "accepted drafts / drafted tokens, pooled",
    "acceptance_by_position": "[i] = steps accepting draft token i+1 / steps drafting >= i+1 tokens",
    "accept_length_hist": "[a] = speculative steps that accepted exactly a drafts",
    "percentiles": "linear interpolation between order statistics",
}


@dataclass
class RequestRecord:
    index: int
    task_id: str
    prompt_tokens: int
    output_tokens: int
    arrival: float
    first_token: float | None
    finish: float | None
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_lens: list[int] = field(default_factory=list)  # per speculative step
    accept_lens: list[int] = field(default_factory=list)  # per speculative step
    finish_reason: str | None = None
    preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def latency(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival

    @property
    def tpot(self) -> float | None:
        if self.first_token is None or self.finish is None or self.output_tokens < 2:
            return None
        return (self.finish - self.first_token) / (self.output_tokens - 1)

    @property
    def tau(self) -> float | None:
        return (self.accepted + self.steps) / self.steps if self.steps else None

    def to_json(self, t0: float = 0.0) -> dict:
        d = asdict(self)
        for k in ("arrival", "first_token", "finish"):  # relative to the point's start: readable, no clock
            d[k] = None if d[k] is None else d[k] - t0
        d.update(ttft_s=self.ttft, tpot_s=self.tpot, latency_s=self.latency, tau=self.tau)
        return d


def record_from_sequence(index: int, task_id: str, seq) -> RequestRecord:
    """A finished engine Sequence (with trace on) -> its record."""
    trace = seq.trace or []
    return RequestRecord(index=index, task_id=task_id, prompt_tokens=len(seq.prompt_ids),
                         output_tokens=seq.num_output, arrival=seq.arrival_time,
                         first_token=seq.first_token_time, finish=seq.finish_time, steps=seq.steps,
                         drafted=seq.drafted, accepted=seq.accepted,
                         draft_lens=[len(d) for d, _ in trace], accept_lens=[a for _, a in trace],
                         finish_reason=seq.finish_reason, preemptions=seq.num_preemptions)


def percentile(values: list[float], q: float) -> float | None:
    """q in [0, 100]; linear interpolation (numpy's default method)."""
    if not values:
        return None
    v = sorted(values)
    pos = q / 100 * (len(v) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def stats(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "min": None, "max": None}
    return {"mean": sum(values) / len(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "min": min(values), "max": max(values)}


def acceptance_by_position(records: list[RequestRecord]) -> tuple[list[float], list[int]]:
    """(rate per draft position, steps that drafted that position)."""
    width = max((k for r in records for k in r.draft_lens), default=0)
    drafted, accepted = [0] * width, [0] * width
    for r in records:
        for k, a in zip(r.draft_lens, r.accept_lens):
            for i in range(k):
                drafted[i] += 1
                if i < a:
                    accepted[i] += 1
    return [a / d if d else 0.0 for a, d in zip(accepted, drafted)], drafted


def accept_length_hist(records: list[RequestRecord]) -> list[int]:
    width = max((k for r in records for k in r.draft_lens), default=-1) + 1
    hist = [0] * width
    for r in records:
        for a in r.accept_lens:
            hist[a] += 1
    return hist


def summarize(records: list[RequestRecord], num_devices: int = 1) -> dict:
    """The point's numbers (see the module docstring) from its finished requests."""
    done = [r for r in records if r.finish is not None]
    if not done:
        raise ValueError("no finished requests to summarize")
    wall = max(r.finish for r in done) - min(r.arrival for r in done)
    total = sum(r.output_tokens for r in done)
    tpots = [r.tpot for r in done if r.tpot is not None]
    user = [1 / t for t in tpots if t > 0]
    e2e = [r.output_tokens / r.latency for r in done if r.latency]
    steps = sum(r.steps for r in done)
    drafted = sum(r.drafted for r in done)
    accepted = sum(r.accepted for r in done)
    by_pos, pos_n = acceptance_by_position(done)
    agg = total / wall if wall > 0 else None
    return {
        "num_requests": len(done), "output_tokens": total, "prompt_tokens": sum(r.prompt_tokens for r in done),
        "wall_s": wall, "aggregate_tokens_per_s": agg,
        "aggregate_tokens_per_s_per_device": None if agg is None else agg / num_devices,
        "request_throughput_per_s": len(done) / wall if wall > 0 else None,
        "tokens_per_s_per_user": sum(user) / len(user) if user else None,
        "e2e_tokens_per_s_per_user": sum(e2e) / len(e2e) if e2e else None,
        "ttft_s": stats([r.ttft for r in done if r.ttft is not None]),
        "tpot_s": stats(tpots),
        "latency_s": stats([r.latency for r in done]),
        "tau": (accepted + steps) / steps if steps else None,
        "acceptance_rate": accepted / drafted if drafted else None,
        "spec_steps": steps, "drafted": drafted, "accepted": accepted,
        "acceptance_by_position": by_pos, "drafted_by_position": pos_n,
        "accept_length_hist": accept_length_hist(done),
        "preemptions": sum(r.preemptions for r in done),
    }
