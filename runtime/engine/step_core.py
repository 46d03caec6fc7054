"""The step, owned once: schedule → run → process outputs over the engine's parts.

:class:`StepCore` is built from the scheduler, the output processor, the request tracker, the
page allocator and radix cache, and a runner (``run(items, between_layers) -> logits`` with
``tokens_run`` / ``forward_passes`` counters). :class:`~agentlang.runtime.engine.engine.Engine`
wraps it with its lock, inbox and API, over the real :class:`ModelRunner`; the model-free tests
(``tests/support/step_harness.py``) build the same class over a fake runner, so they test this step,
not a copy. Its :meth:`metrics` and :meth:`snapshot` read only its own parts; callers hold
the step lock (never mid-step).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from agentlang.runtime.cache.page_allocator import PageAllocator
from agentlang.runtime.cache.page_table import memory_metrics
from agentlang.runtime.cache.window_pages import window_metrics
from agentlang.runtime.cache.radix_cache import RadixCache
from agentlang.runtime.cache.snapshot import snapshot_tree
from agentlang.runtime.core.errors import UNFIT_IN_KV_POOL
from agentlang.runtime.engine.layer_break import LayerBreaks
from agentlang.runtime.engine.output_processor import OutputProcessor
from agentlang.runtime.engine.request_tracker import RequestTracker
from agentlang.runtime.engine.sessions import EngineSessions
from agentlang.runtime.engine.snapshot import EngineSnapshot
from agentlang.runtime.scheduler.scheduled import ScheduledItem
from agentlang.runtime.scheduler.scheduler import Scheduler


class Runner(Protocol):
    """What the step needs of a model runner (``ModelRunner`` or a test's fake)."""

    tokens_run: int
    forward_passes: int

    def run(self, items: Sequence[ScheduledItem],
            between_layers: Callable[[], None] | None = None) -> torch.Tensor: ...


class StepCore:
    """``take_arrivals()`` runs the submissions queued since and says whether there were any
    (the layer breaks take them mid-step; ``pending``: the flag set while some wait, which a
    native step polls between its layers); ``sessions`` (if any) ticks at each step."""

    def __init__(self, scheduler: Scheduler, processor: OutputProcessor, tracker: RequestTracker,
                 allocator: PageAllocator, cache: RadixCache, runner: Runner,
                 take_arrivals: Callable[[], bool], sessions: EngineSessions | None = None,
                 pending: ctypes.c_int32 | None = None):
        self.sessions = sessions
        self.scheduler = scheduler
        self.processor = processor
        self.tracker = tracker
        self.allocator = allocator
        self.cache = cache
        self.runner = runner
        self.breaks = LayerBreaks(scheduler, processor, take_arrivals, runner.run, pending)
        self.peak_pages_used = 0

    def step(self) -> bool:
        """One scheduling step (the caller drained its inbox first); whether work remains."""
        if self.sessions is not None:
            self.sessions.tick()
        self.processor.admit_ready_grammars()
        batch = self.scheduler.schedule()
        for req in batch.unfit:
            self.processor.finish(req, "length", error=UNFIT_IN_KV_POOL)
        if batch.items:
            self.peak_pages_used = max(self.peak_pages_used, self.allocator.num_used)
            logits = self.runner.run(batch.items, self.breaks.hook(batch.items))
            self.processor.process(batch.items, logits)
        return self.scheduler.has_work or self.tracker.num_waiting_grammar > 0

    def reset_peak(self) -> None:
        self.peak_pages_used = self.allocator.num_used

    def metrics(self) -> dict[str, float]:
        """Prefix cache, pages, memory, scheduling and token counters as one flat dict; every
        value is also a ``/metrics`` series on the server."""
        sched, alloc, cache = self.scheduler, self.allocator, self.cache
        tables = [t for t in (r.page_table for r in sched.running) if t is not None]
        c = memory_metrics(cache, tables, sched.table_stats)
        used = alloc.num_used
        counters = self.tracker.counters
        return {
            "prefix_cache_queried_tokens": c["prefix_queried_tokens"],
            "prefix_cache_hit_tokens": c["prefix_hit_tokens"],
            "prefix_cache_hit_rate": c["prefix_hit_rate"],
            "pages_total": alloc.num_pages,
            "pages_used": used,
            "pages_free": alloc.num_free,
            "peak_pages_used": max(self.peak_pages_used, used),
            "pages_evictable": cache.evictable_pages,
            "pages_protected": cache.protected_pages,
            "evictions": c["evicted_pages"],
            "cow_copies": c["cow_copies"],
            "kv_waste_pct": c["kv_waste_pct"],
            "kv_utilization": used / alloc.num_pages,
            "pages_cache_only": c["pages_cache_only"],
            "pages_private": c["pages_private"],
            "pages_shared": c["pages_shared"],
            "preemptions": sched.preemptions,
            "live_programs": sched.live.live_now,
            "live_program_limit": sched.live.limit,
            "live_limit_lowered": sched.live.lowered,
            "layer_break_steps": self.breaks.steps,
            "tokens_run": self.runner.tokens_run,
            "forward_passes": self.runner.forward_passes,
            "prompt_tokens": counters.prompt_tokens,
            "generated_tokens": counters.generated_tokens,
            "requests_finished": counters.requests_finished,
            "spec_draft_tokens": counters.spec_draft_tokens,
            "spec_accepted_tokens": counters.spec_accepted_tokens,
            "spec_verify_steps": counters.spec_verify_steps,
            "spec_row_cost": self.processor.spec_row_cost,
            **self._session_metrics(),
            **window_metrics(alloc.windows),
            "num_running": len(sched.running),
            "num_waiting": len(sched.waiting) + self.tracker.num_waiting_grammar,
            "page_size": cache.page_size,
        }

    def _session_metrics(self) -> dict[str, float]:
        r = self.scheduler.retention
        out = {"sessions_open": 0 if self.sessions is None else len(self.sessions.registry),
               "session_holds": len(r), "session_held_pages": r.held_pages(),
               "session_demoted_pages": r.stats.demoted_pages}
        out.update({f"session_releases_{k}": v for k, v in r.stats.released.items()})
        return out

    def snapshot(self, max_nodes: int, pages: bool) -> EngineSnapshot:
        """Copy the live state (see :mod:`agentlang.runtime.engine.snapshot`); ``cost_ms`` is
        the time it took, on the stepping thread's lock."""
        t0 = time.perf_counter()
        tree = snapshot_tree(self.cache, max_nodes) if max_nodes else None
        refcounts = self.allocator.refcounts() if pages else None
        owned = self.cache.owned_pages() if pages else None
        rows = self.scheduler.request_rows(t0)
        metrics = self.metrics()
        evictions = list(self.cache.recent_evictions)
        sessions = tuple(self.sessions.rows()) if self.sessions is not None else ()
        cost = (time.perf_counter() - t0) * 1000.0
        return EngineSnapshot(time.time(), metrics, tree, refcounts, owned, rows, evictions,
                              self.cache.page_size, cost, sessions)
