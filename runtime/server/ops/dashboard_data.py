"""The dashboard's JSON document, built from an :class:`~agentlang.runtime.engine.snapshot.EngineSnapshot`
off the engine thread. Every figure the page shows is a field here and also a ``/metrics``
series (named in ``POOL_SERIES``), computed by the same code."""

from __future__ import annotations

from collections.abc import Callable

from agentlang.runtime.cache.snapshot import TreeSnapshot
from agentlang.runtime.engine.snapshot import EngineSnapshot, namespace_label, page_map
from agentlang.runtime.server.ops.programs import ProgramTracker

# page figure -> (engine.metrics() key, /metrics series)
POOL_SERIES = {
    "free": ("pages_free", "agentlang_kv_pages_free"),
    "cached": ("pages_cache_only", "agentlang_kv_pages_cache_only"),
    "in_use": ("pages_private", "agentlang_kv_pages_private"),
    "shared": ("pages_shared", "agentlang_kv_pages_shared"),
    "used": ("pages_used", "agentlang_kv_pages_used"),
    "total": ("pages_total", "agentlang_kv_pages_total"),
    "utilization": ("kv_utilization", "agentlang_kv_utilization"),
    "waste_pct": ("kv_waste_pct", "agentlang_kv_waste_percent"),
    "evictable": ("pages_evictable", "agentlang_kv_pages_cached_evictable"),
    "pinned": ("pages_protected", "agentlang_kv_pages_cached_pinned"),
    "hit_rate": ("prefix_cache_hit_rate", "agentlang_prefix_cache_hit_rate"),
    "running": ("num_running", "agentlang_num_requests_running"),
    "waiting": ("num_waiting", "agentlang_num_requests_waiting"),
    "preemptions": ("preemptions", "agentlang_preemptions_total"),
    "evicted_pages": ("evictions", "agentlang_kv_evicted_pages_total"),
    "cow_copies": ("cow_copies", "agentlang_cow_copies_total"),
    "sessions": ("sessions_open", "agentlang_sessions_open"),
    "session_held": ("session_held_pages", "agentlang_kv_pages_session_held"),
}


def build(snap: EngineSnapshot, tokenizer, programs: ProgramTracker, series: dict) -> dict:
    m = snap.metrics
    states = page_map(snap)
    figures = {name: m[key] for name, (key, _) in POOL_SERIES.items()}
    # the page map and the counters come from one consistent snapshot: they agree
    assert (states.free, states.cache_only, states.private, states.shared) == \
        (m["pages_free"], m["pages_cache_only"], m["pages_private"], m["pages_shared"])
    running = {r.rid for r in snap.requests if r.state == "running"}
    waiting = {r.rid for r in snap.requests if r.state == "waiting"}
    return {
        "time": snap.time,
        "cost_ms": round(snap.cost_ms, 3),
        "pool": {"page_size": snap.page_size, "map": states.codes.decode("ascii"),
                 "figures": figures,
                 "series": {name: s for name, (_, s) in POOL_SERIES.items()}},
        "tree": None if snap.tree is None else tree_json(
            snap.tree, lambda ids: tokenizer.decode(ids, skip_special_tokens=False)),
        "evictions": [{"time": e.time, "tokens": e.tokens, "parent": e.parent_id,
                       "namespace": namespace_label(e.namespace)} for e in snap.evictions],
        "requests": [r.as_dict() for r in snap.requests],
        "sessions": [r.as_dict() for r in snap.sessions],
        "programs": programs.graphs(running, waiting),
        "series": series,
    }


def tree_json(t: TreeSnapshot, decode: Callable[[list[int]], str]) -> dict:
    """The tree part of the document: one row per node, labels from ``decode`` (token ids →
    text); namespace roots are labelled by their namespace."""
    nodes = []
    for r in t.rows:
        label = namespace_label(r.namespace) if r.parent == 0 else decode(list(r.head))
        nodes.append([r.id, r.parent, r.depth, r.tokens, r.pages, r.lock_ref, r.refcount,
                      r.last_access, r.hidden_children, r.hidden_pages, label])
    return {"columns": ["id", "parent", "depth", "tokens", "pages", "lock_ref", "refcount",
                        "last_access", "hidden_children", "hidden_pages", "label"],
            "nodes": nodes, "cached_pages": t.cached_pages, "shown_pages": t.shown_pages,
            "truncated": t.truncated}
