"""Prometheus metrics of one server (its own registry, so several servers can live in one process).

Per request (recorded when it ends): requests by finish reason (stop, length, abort = client gone, error),
prompt / generation tokens, time to first token, time per output token, end-to-end latency, acceptance length
tau. Per engine iteration (recorded by the engine thread): batch size, iteration time, drafted / accepted draft
tokens. At scrape time: running / waiting / unfinished requests, KV cache blocks and usage, preemptions, and the
process collector's resident memory. Fixed at start: the KV cache's bytes and bytes per token, target and drafter.

Speculation also under vLLM's names, with vLLM's meaning, which dashboards and AIPerf read:
`vllm:spec_decode_num_drafts_total` (request steps that verified drafts), `..._num_draft_tokens_total`,
`..._num_accepted_tokens_total` and `..._num_accepted_tokens_per_pos_total{position}` (0-based: steps whose
draft at that position was accepted). Mean acceptance length = 1 + accepted / drafts.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..engine import EngineMetrics, IterationStats
from ..memory import kv_pool_bytes

P = "dflash_"
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                   40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.4, 0.5, 0.75, 1.0, 2.5)
TAU_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 16.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024)


class ServerMetrics:
    def __init__(self, engine, unfinished, max_queue: int, model_name: str = ""):
        self.registry = r = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.requests = Counter(P + "requests", "Finished requests by finish reason (abort: the client left)",
                                ["finish_reason"], registry=r)
        self.rejected = Counter(P + "requests_rejected", "Requests answered with an error status", ["status"],
                                registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Time from request arrival to its first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(P + "time_per_output_token_seconds", "Mean time per output token after the first",
                              buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Time from request arrival to its last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.tau = Histogram(P + "acceptance_length", "Tokens committed per speculative step (tau), per request",
                             buckets=TAU_BUCKETS, registry=r)
        self.batch_size = Histogram(P + "batch_size", "Requests per engine iteration", buckets=BATCH_BUCKETS,
                                    registry=r)
        self.iteration = Histogram(P + "iteration_seconds", "Engine iteration time", buckets=LATENCY_BUCKETS,
                                   registry=r)
        self.drafted = Counter(P + "draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted = Counter(P + "accepted_draft_tokens", "Draft tokens accepted", registry=r)
        self._spec_counters(engine, model_name)
        r.register(_EngineCollector(engine, unfinished, max_queue, model_name))
        _observe_iterations(engine, self)

    def _spec_counters(self, engine, model_name: str) -> None:
        r, lab = self.registry, ["model_name"]
        self.num_drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", lab,
                                  registry=r).labels(model_name)
        self.num_draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", lab,
                                        registry=r).labels(model_name)
        self.num_accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", lab,
                                    registry=r).labels(model_name)
        per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                          lab + ["position"], registry=r)
        self.per_pos = [per_pos.labels(model_name, str(i)) for i in range(engine.max_draft_len)]
        kv = Gauge(P + "kv_cache_bytes", "Bytes of the KV cache pool (drafter: its context K/V)", ["model"],
                   registry=r)
        kv_tok = Gauge(P + "kv_cache_bytes_per_token", "KV cache bytes per cached token", ["model"], registry=r)
        for model, b in kv_pool_bytes(engine).items():
            kv.labels(model).set(b["bytes"])
            kv_tok.labels(model).set(b["bytes_per_token"])

    def drafts_done(self, accepted: list[int], draft_tokens: int) -> None:
        """Steps of one request that verified drafts (AsyncLLM's on_drafts, on the engine thread)."""
        self.num_drafts.inc(len(accepted))
        self.num_draft_tokens.inc(draft_tokens)
        self.num_accepted.inc(sum(accepted))
        for a in accepted:
            for c in self.per_pos[:a]:
                c.inc()

    def request_done(self, reason: str, prompt_tokens: int, out, arrival: float, first: float | None,
                     end: float) -> None:
        self.requests.labels(reason).inc()
        n = len(out.token_ids) if out is not None else 0
        self.generation_tokens.inc(n)
        if first is not None:
            self.ttft.observe(first - arrival)
            if n > 1 and reason != "abort":
                self.tpot.observe((end - first) / (n - 1))
        if reason in ("stop", "length"):
            self.e2e.observe(end - arrival)
            if out is not None and out.tau is not None:
                self.tau.observe(out.tau)

    def iteration_done(self, it: IterationStats) -> None:
        self.batch_size.observe(it.batch_size)
        self.iteration.observe(it.seconds)
        if it.drafted:
            self.drafted.inc(it.drafted)
            self.accepted.inc(it.accepted)


class _ObservedMetrics(EngineMetrics):
    """The engine's iteration log, which also feeds the Prometheus histograms (called on the engine thread)."""

    def __init__(self, base: EngineMetrics, sink: ServerMetrics):
        super().__init__(iterations=base.iterations, keep=base.keep)
        self._sink = sink

    def record(self, it: IterationStats) -> None:
        super().record(it)
        self._sink.iteration_done(it)


def _observe_iterations(engine, sink: ServerMetrics) -> None:
    if isinstance(engine.metrics, _ObservedMetrics):  # a newer server on the same engine takes over
        engine.metrics._sink = sink
    else:
        engine.metrics = _ObservedMetrics(engine.metrics, sink)


class _EngineCollector:
    """Gauges read at scrape time (the engine thread owns these numbers; reading them is a benign race)."""

    def __init__(self, engine, unfinished, max_queue: int, model_name: str = ""):
        self.engine, self.unfinished, self.max_queue = engine, unfinished, max_queue
        self.model_name = model_name

    def describe(self):
        return []

    def collect(self):
        s = self.engine.stats()
        for name, doc, value in (
                ("num_requests_running", "Requests in the running batch", s["running"]),
                ("num_requests_waiting", "Requests admitted by the engine, waiting for the batch", s["waiting"]),
                ("num_requests_unfinished", "Requests accepted by the server and not finished (bounded by "
                 "max_queue)", self.unfinished()),
                ("max_queue", "Unfinished requests beyond which the server answers 429", self.max_queue),
                ("kv_cache_usage_ratio", "Fraction of KV cache blocks in use", s["cache_usage"]),
                ("kv_cache_blocks_free", "Free KV cache blocks", s["cache_blocks_free"]),
                ("kv_cache_blocks_total", "KV cache blocks", s["cache_blocks_total"])):
            yield GaugeMetricFamily(P + name, doc, value=value)
        yield CounterMetricFamily(P + "preemptions", "Requests preempted for cache space", value=s["preemptions"])
        for name, doc, key in (("queries", "Prefix cache queries, in terms of number of queried tokens.",
                                "prefix_cache_queries"),
                               ("hits", "Prefix cache hits, in terms of number of cached tokens.", "prefix_cache_hits")):
            c = CounterMetricFamily("vllm:prefix_cache_" + name, doc, labels=["model_name"])  # vLLM's names
            c.add_metric([self.model_name], s[key])
            yield c
