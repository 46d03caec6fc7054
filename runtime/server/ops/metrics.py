"""Prometheus metrics of one server, in its own ``CollectorRegistry`` (no global state).

Engine figures are read at scrape time from ``engine.metrics()`` by a custom collector (gauges
for state, counters for cumulative totals); request latencies are histograms the endpoints
observe when a request finishes. Names are prefixed ``agentlang_``. Per-agent totals
(``agentlang_agent_*_total{agent="..."}``) come from ``engine.agent_stats`` (bounded labels,
overflow into ``"other"``).
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
    ("sessions_open", "sessions_open", "Open sessions (SGLang's and session_id ones)."),
    ("session_holds", "session_holds", "Finished turns whose KV is held for their next turn."),
    ("kv_pages_session_held", "session_held_pages",
     "Distinct KV pages kept by session holds (shared prefixes counted once)."),
    ("live_programs", "live_programs",
     "Programs with a running request or a session hold (schedule policy live; else 0)."),
    ("live_program_limit", "live_program_limit",
     "Schedule policy live: most live programs before a new one may start (max_running: none)."),
    ("speculative_row_cost", "spec_row_cost",
     "Speculative decoding: one more verify row's cost relative to a one-row step, as the draft "
     "policy uses it (measured at the first draft decision unless given; 0.35 until then)."),
    ("kv_window_pages_total", "window_pages_total",
     "Sliding-window layers' KV pages in all (0: the model has no sliding layers)."),
    ("kv_window_pages_free", "window_pages_free", "Sliding-window KV pages on the free list."),
    ("kv_window_pages_pinned", "window_pages_pinned",
     "Sliding-window KV pages inside some running request's window."),
    ("kv_window_pages_idle", "window_pages_idle",
     "Sliding-window KV pages out of every running window, kept for prefix hits (evictable)."),
)
COUNTERS = (
    ("prefix_cache_queried_tokens", "prefix_cache_queried_tokens",
     "Prompt tokens looked up in the prefix cache."),
    ("prefix_cache_hit_tokens", "prefix_cache_hit_tokens",
     "Prompt tokens found in the prefix cache."),
    ("preemptions", "preemptions", "Running requests preempted for lack of KV pages."),
    ("live_limit_lowered", "live_limit_lowered",
     "Schedule policy live: times a short KV pool lowered the live-program limit."),
    ("layer_break_steps", "layer_break_steps",
     "Steps run between the layers of a step in flight for higher-priority arrivals."),
    ("cow_copies", "cow_copies", "Copy-on-write page copies."),
    ("kv_evicted_pages", "evictions", "Prefix-cache pages evicted under memory pressure."),
    ("kv_session_demoted_pages", "session_demoted_pages",
     "KV pages of closed sessions' histories marked dead (evicted before live ones)."),
    ("kv_window_evicted_pages", "window_evictions",
     "Idle sliding-window KV pages evicted for new ones."),
    ("prompt_tokens", "prompt_tokens", "Prompt tokens submitted."),
    ("generation_tokens", "generated_tokens", "Tokens generated."),
    ("requests_finished", "requests_finished", "Requests finished by the engine."),
    ("forward_passes", "forward_passes", "Model forward passes."),
    ("spec_draft_tokens", "spec_draft_tokens",
     "Speculative decoding: draft tokens from the context verified."),
    ("spec_accepted_tokens", "spec_accepted_tokens",
     "Speculative decoding: draft tokens kept (the model sampled them)."),
    ("spec_verify_steps", "spec_verify_steps",
     "Speculative decoding: completion-steps that verified a draft."),
)
# per-agent series (agentlang.runtime.core.agent_stats totals, label "agent"): name suffix, total key, help
AGENT_COUNTERS = (
    ("agent_requests", "requests", "Finished requests by agent label."),
    ("agent_prompt_tokens", "prompt_tokens", "Prompt tokens of finished requests by agent."),
    ("agent_generation_tokens", "generated_tokens", "Tokens generated by agent."),
    ("agent_cached_tokens", "cached_tokens", "Prompt tokens found in the prefix cache by agent."),
    ("agent_queue_seconds", "queue_s", "Time from arrival to first admission, summed by agent."),
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
        releases = CounterMetricFamily("agentlang_session_hold_releases",
                                       "Session holds given back, by reason.", labels=["reason"])
        for key in sorted(k for k in m if k.startswith("session_releases_")):
            releases.add_metric([key[len("session_releases_"):]], float(m[key]))
        yield releases
        held = GaugeMetricFamily("agentlang_session_held_pages_by_session",
                                 "KV pages on the path each open session's hold keeps.",
                                 labels=["session"])
        for row in self.engine.sessions.rows():
            held.add_metric([row.id], float(row.held_pages))
        yield held
        totals = self.engine.agent_stats.snapshot()
        for suffix, key, doc in AGENT_COUNTERS:
            family = CounterMetricFamily(f"agentlang_{suffix}", doc, labels=["agent"])
            for label, t in sorted(totals.items()):
                family.add_metric([label], float(t[key]))
            yield family

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
