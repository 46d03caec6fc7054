"""Prometheus metrics of one server, in its own ``CollectorRegistry`` (no global state).

Engine figures are read at scrape time from ``engine.metrics()`` by a custom collector (gauges
for state, counters for cumulative totals); request latencies are histograms the endpoints
observe when a request finishes. Names are prefixed ``agentlang_``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

# name suffix, engine.metrics() key, help
GAUGES = (
    ("num_requests_running", "num_running", "Requests being computed (admitted to the batch)."),
    ("num_requests_waiting", "num_waiting", "Requests queued (or compiling their grammar)."),
    ("kv_pages_used", "pages_used", "KV pool pages in use (requests and prefix cache)."),
    ("kv_pages_total", "pages_total", "KV pool pages in all."),
    ("kv_pages_free", "pages_free", "KV pool pages on the free list."),
    ("kv_pages_cached_evictable", "pages_evictable", "Prefix-cache pages evictable now."),
    ("kv_pages_cached_pinned", "pages_protected", "Prefix-cache pages locked by users."),
    ("kv_pages_peak", "peak_pages_used", "Most KV pages in use at once."),
    ("prefix_cache_hit_rate", "prefix_cache_hit_rate",
     "Prefix cache hit tokens / queried tokens since start."),
    ("kv_utilization", "kv_utilization", "KV pool pages in use / pages in all (0..1)."),
    ("kv_waste_percent", "kv_waste_pct",
     "Token slots of in-use pages holding no token's K/V, in percent of those slots."),
    ("kv_pages_cache_only", "pages_cache_only",
     "KV pages held by the prefix cache alone (refcount 1)."),
    ("kv_pages_private", "pages_private", "KV pages held by one request alone (refcount 1)."),
    ("kv_pages_shared", "pages_shared",
     "KV pages with refcount > 1: cache + requests, or forks sharing them (copy-on-write)."),
)
COUNTERS = (
    ("prefix_cache_queried_tokens", "prefix_cache_queried_tokens",
     "Prompt tokens looked up in the prefix cache."),
    ("prefix_cache_hit_tokens", "prefix_cache_hit_tokens",
     "Prompt tokens found in the prefix cache."),
    ("preemptions", "preemptions", "Running requests preempted for lack of KV pages."),
    ("cow_copies", "cow_copies", "Copy-on-write page copies."),
    ("kv_evicted_pages", "evictions", "Prefix-cache pages evicted under memory pressure."),
    ("prompt_tokens", "prompt_tokens", "Prompt tokens submitted."),
    ("generation_tokens", "generated_tokens", "Tokens generated."),
    ("requests_finished", "requests_finished", "Requests finished by the engine."),
    ("forward_passes", "forward_passes", "Model forward passes."),
)


class _EngineCollector:
    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        m = self.engine.metrics()
        for suffix, key, doc in GAUGES:
            yield GaugeMetricFamily(f"agentlang_{suffix}", doc, value=float(m[key]))
        for suffix, key, doc in COUNTERS:
            yield CounterMetricFamily(f"agentlang_{suffix}", doc, value=float(m[key]))

    def describe(self):
        return []


class ServerMetrics:
    def __init__(self, engine):
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(engine))
        self.ttft = Histogram("agentlang_time_to_first_token_seconds",
                              "Time from arrival to the first output token.",
                              buckets=TTFT_BUCKETS, registry=self.registry)
        self.e2e = Histogram("agentlang_e2e_request_latency_seconds",
                             "Time from arrival to the last output token.",
                             buckets=E2E_BUCKETS, registry=self.registry)
        self.requests = Counter("agentlang_http_requests", "Generation requests by endpoint "
                                "and outcome.", ["endpoint", "outcome"], registry=self.registry)

    def observe(self, endpoint: str, meta: dict, outcome: str = "ok") -> None:
        """Record one finished engine request (its ``RequestOutput.meta``)."""
        if meta.get("ttft_s") is not None:
            self.ttft.observe(meta["ttft_s"])
        if meta.get("latency_s") is not None:
            self.e2e.observe(meta["latency_s"])
        self.requests.labels(endpoint, outcome).inc()

    def count(self, endpoint: str, outcome: str) -> None:
        self.requests.labels(endpoint, outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
