"""The engine's figures as one flat dict (``Engine.metrics()``): prefix cache, pages, memory,
scheduling and token counters. Every value is also a ``/metrics`` series on the server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentlang.runtime.cache.page_table import memory_metrics

if TYPE_CHECKING:
    from agentlang.runtime.engine.engine import Engine


def engine_metrics(engine: Engine) -> dict[str, float]:
    """Read the engine's public state; the caller holds the step lock (never mid-step)."""
    tables = [t for t in (r.page_table for r in engine.scheduler.running) if t is not None]
    c = memory_metrics(engine.cache, tables, engine.scheduler.table_stats)
    used = engine.allocator.num_used
    counters = engine.tracker.counters
    return {
        "prefix_cache_queried_tokens": c["prefix_queried_tokens"],
        "prefix_cache_hit_tokens": c["prefix_hit_tokens"],
        "prefix_cache_hit_rate": c["prefix_hit_rate"],
        "pages_total": engine.allocator.num_pages,
        "pages_used": used,
        "pages_free": engine.allocator.num_free,
        "peak_pages_used": max(engine.peak_pages_used, used),
        "pages_evictable": engine.cache.evictable_pages,
        "pages_protected": engine.cache.protected_pages,
        "evictions": c["evicted_pages"],
        "cow_copies": c["cow_copies"],
        "kv_waste_pct": c["kv_waste_pct"],
        "kv_utilization": used / engine.allocator.num_pages,
        "pages_cache_only": c["pages_cache_only"],
        "pages_private": c["pages_private"],
        "pages_shared": c["pages_shared"],
        "preemptions": engine.scheduler.preemptions,
        "layer_break_steps": engine.breaks.steps,
        "tokens_run": engine.runner.tokens_run,
        "forward_passes": engine.runner.forward_passes,
        "prompt_tokens": counters.prompt_tokens,
        "generated_tokens": counters.generated_tokens,
        "requests_finished": counters.requests_finished,
        "num_running": len(engine.scheduler.running),
        "num_waiting": len(engine.scheduler.waiting) + engine.tracker.num_waiting_grammar,
        "page_size": engine.config.page_size,
    }

