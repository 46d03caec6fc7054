"""Continuous-batching scheduler: admission, chunked prefill, page reservation, preemption.

Each :meth:`Scheduler.schedule` call picks the work of one step within ``max_batch_tokens``:

1. every running request with uncomputed tokens, oldest admission first — decodes cost one
   token, an unfinished (chunked) prefill takes what budget is left;
2. waiting requests by effective priority (``core.priority``: priority plus one per
   ``max_wait_steps`` steps waited, the aging rule), then (policy ``program`` / ``continue``
   and ``live``) least / most served program, then longest cached prefix, up to ``max_running``
   and (``live``) the live-program limit; one outranking a running request may take one of
   ``urgent_slots`` slots above it, and only when those or the pages are taken preempts running
   ones of lower effective priority; one overlapping a prefill in flight waits a step.

An *urgent* step (``PriorityPolicy.urgent_rank``: a request needing a prefill outranks some
request present) does 1–2 first for the requests at or above that rank only, within the budget
less ``min(max_lower_priority_tokens, max_batch_tokens // 2)``, then 1–2 for the rest within at
most ``max_lower_priority_tokens`` tokens. With equal priorities no step is urgent. Between
the layers of a step in flight, arrivals that outrank part of it are admitted and served
(:meth:`Scheduler.admit_between_layers`, ``agentlang.runtime.engine.layer_break``).

Out of pages: evict from the radix cache, release session holds (``cache.retention``; a hold
never makes a request wait), then preempt the running request of lowest effective priority,
newest admission first (its KV goes into the cache; it is requeued). A request is never
dropped; one that cannot fit even alone ends with ``finish_reason="length"``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from agentlang.runtime.cache.page_allocator import OutOfPagesError, PageAllocator
from agentlang.runtime.cache.page_table import PageTable, PageTableStats
from agentlang.runtime.cache.retention import Retention
from agentlang.runtime.core.priority import PriorityPolicy
from agentlang.runtime.cache.radix_cache import RadixCache, TokenKey
from agentlang.runtime.request.request import Request, RequestRow
from agentlang.runtime.scheduler.config import SchedulerConfig
from agentlang.runtime.scheduler.live_programs import LiveGate, LivePrograms
from agentlang.runtime.scheduler.scheduled import (Schedule, ScheduledItem, overlaps_inflight,
                                                    tokens_of)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, allocator: PageAllocator, cache: RadixCache,
                 copy_fn: Callable[[list[int], list[int]], None],
                 on_preempt: Callable[[Request], None] | None = None):
        self.cfg = cfg
        self.allocator = allocator
        self.cache = cache
        self.copy_fn = copy_fn
        self.table_stats = PageTableStats()
        self.policy = PriorityPolicy(cfg.low_priority_values_first, cfg.max_wait_steps,
                                     cfg.schedule_policy)
        self.retention = Retention(cache, cfg.retain_max_pages, cfg.schedule_policy == "live")
        self.live = LivePrograms(cfg.max_running, cfg.schedule_policy == "live",
                                 cfg.busy_requests)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0
        self._urgent_cap = cfg.max_running + cfg.urgent_slots   # for outranking admissions
        self._admit_counter = 0
        self.on_preempt = on_preempt

    # ---- queue -------------------------------------------------------------------------
    def add(self, req: Request, front: bool = False) -> None:
        (self.waiting.appendleft if front else self.waiting.append)(req)

    def remove(self, req: Request) -> None:
        """Take a request out of the queues and release everything it holds."""
        if req in self.running:
            self.running.remove(req)
            self.release(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    def request_rows(self, now: float) -> list[RequestRow]:
        """Running requests (admission order), then waiting ones (queue order). Call it where
        no step runs (under the engine's step lock)."""
        return [r.row("running", now) for r in self.running] + \
            [r.row("waiting", now) for r in self.waiting]

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- pages -------------------------------------------------------------------------
    def release(self, req: Request) -> None:
        """Hand the request's computed KV to the radix cache and unlock its prefix."""
        if req.page_table is not None:
            computed = TokenKey.trusted(req.all_ids[: req.num_computed])
            pages = req.page_table.detach()
            self.cache.release_into_cache(computed, pages, req.group.namespace)
            req.page_table = None
        if req.lock_node is not None:
            self.cache.unlock(req.lock_node)
            req.lock_node = None

    def cache_computed(self, req: Request) -> None:
        """Insert the computed full pages of a running request into the tree (so others can
        match its prefix now) and move its lock to the deepest cached node."""
        ps = self.cfg.page_size
        n = req.num_computed // ps * ps
        if n == 0 or not self.cache.enabled:
            return
        pages = req.page_table.pages[: n // ps]
        tokens = TokenKey.trusted(req.all_ids[:n])
        self.allocator.incref(pages)               # the tree's own reference
        cached = self.cache.insert(tokens, pages, req.group.namespace)
        self.allocator.decref(pages[: cached // ps])
        node = self.cache.match_prefix(tokens, req.group.namespace, record=False).node
        self.cache.lock(node)
        if req.lock_node is not None:
            self.cache.unlock(req.lock_node)
        req.lock_node = node

    def retain(self, req: Request, key, now: float, ttl: float, gap: float | None) -> bool:
        """Hold finished ``req``'s KV for ``key``, back in ``gap`` s (None: estimated)."""
        tokens = TokenKey.trusted(req.all_ids[: req.num_computed])
        node = self.cache.match_prefix(tokens, req.group.namespace, record=False).node
        self.live.held(key, req)
        return self.retention.hold(key, node, now, ttl, gap, self.policy.rank(req.priority))

    def _reserve(self, req: Request, n: int, can_preempt: bool) -> bool:
        """Reserve pages for ``n`` more tokens of ``req``: evict from the cache, release session
        holds (running: all; admission: those of lower rank, or any when nothing runs; neither
        when window pages ran short), then (if allowed) preempt the policy's victim (lowest
        priority, newest), maybe ``req``. False if ``req`` got no pages (maybe preempted)."""
        while True:
            try:
                req.page_table.reserve(n, self.copy_fn)
                return True
            except OutOfPagesError as e:
                need = -(-(req.page_table.num_tokens + n) // self.cfg.page_size) \
                    - len(req.page_table.pages) + 1
                if e.evicting_helps and self.cache.evict(max(need - self.allocator.num_free, 1)) > 0:
                    continue
                below = None if can_preempt or not self.running else \
                    self.policy.rank(req.priority)
                if e.evicting_helps and self.retention.release_for_pages(below):
                    continue
                if not can_preempt or len(self.running) <= 1:
                    return False
                victim = self.policy.victim(self.running)
                self.preempt(victim)
                if victim is req:
                    return False

    def adopt_fork(self, parent: Request, child: Request, table: PageTable) -> None:
        """Run ``child``, an n>1 sibling forked from the running ``parent`` at its first sample:
        it holds ``table`` (a copy-on-write fork of the parent's) and shares its prefix lock."""
        child.page_table, child.num_computed = table, parent.num_computed
        if parent.lock_node is not None:
            self.cache.lock(parent.lock_node)
            child.lock_node = parent.lock_node
        self._admit_counter += 1
        child.admit_seq = self._admit_counter
        self.running.append(child)

    def preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.release(req)
        req.num_computed = 0
        req.draft = []
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)
        if self.on_preempt is not None:
            self.on_preempt(req)

    # ---- priority preemption (PriorityPolicy.make_room's RoomCosts) -----------------------
    def pages_needed(self, req: Request) -> int:
        m = self.cache.match_prefix(TokenKey.trusted(req.all_ids), req.group.namespace,
                                    record=False)
        return -(-(req.num_tokens + 1 - m.length) // self.cfg.page_size) + 1

    def pages_held(self, req: Request) -> int:
        return len(req.page_table.pages) if req.page_table is not None else 0

    # ---- the step ----------------------------------------------------------------------
    def schedule(self) -> Schedule:
        over = self.policy.outranking(self.waiting, self.running)
        if over:     # only these can preempt; they may first take the urgent slots
            self.policy.make_room(over, self.running, self._urgent_cap - len(self.running),
                                  self.allocator.num_free + self.cache.evictable_pages
                                  + self.retention.releasable_pages(), self)
        top = self.policy.urgent_rank(self.waiting, self.running)
        first = (lambda r: True) if top is None else (lambda r: self.policy.effective(r) >= top)
        items: list[ScheduledItem] = []
        unfit: list[Request] = []
        low = self.cfg.max_lower_priority_tokens
        # an urgent step keeps min(low, half the step) tokens for the rest: they progress
        limit = self.cfg.max_batch_tokens - (0 if top is None else
                                             min(low, self.cfg.max_batch_tokens // 2))
        self._run_running(items, unfit, first, limit)
        for r in self.waiting:
            r.wait_steps += 1
        outrank = set(map(id, over))
        self._admit(items, limit - tokens_of(items), lambda r: first(r) and id(r) in outrank,
                    self._urgent_cap)
        gate = self.live.gate(self.running, self.retention, self.preemptions)
        self._admit(items, limit - tokens_of(items), first, gate=gate)
        if top is not None:      # an urgent step: the rest get a small budget
            limit = min(self.cfg.max_batch_tokens, tokens_of(items) + low)
            rest = lambda r: not first(r)                      # noqa: E731
            self._run_running(items, unfit, rest, limit)
            self._admit(items, limit - tokens_of(items), rest, gate=gate)
        return Schedule(items, unfit)

    def _run_running(self, items: list[ScheduledItem], unfit: list[Request],
                     select: Callable[[Request], bool], limit: int) -> None:
        """Append the uncomputed work of the selected running requests (oldest admission
        first) while ``items`` hold fewer than ``limit`` tokens. Reserving pages may preempt;
        preempted requests' items are dropped, ``unfit`` gets those that cannot fit alone."""
        budget = limit - tokens_of(items)
        for req in sorted((r for r in self.running if select(r)), key=lambda r: r.admit_seq):
            if req not in self.running or req.num_uncomputed == 0 or budget <= 0:
                continue
            if req.draft and req.num_uncomputed > budget:
                req.draft = []                        # a draft is verified whole or not at all
            n = min(req.num_uncomputed, budget)
            if not self._reserve(req, n, can_preempt=True):
                if req in self.running:              # alone and still no room: cannot fit
                    self.running.remove(req)
                    self.release(req)
                    unfit.append(req)
                continue
            items.append(self._item(req, n))
            budget -= n
        # Preemption may have removed requests scheduled earlier in this loop.
        items[:] = [it for it in items if it.req in self.running]

    def admit_between_layers(self, in_flight: list[Request]) -> list[ScheduledItem]:
        """A step run between the layers of the step of ``in_flight``: admits the waiting
        requests that outrank some of them (``PriorityPolicy.outranking``) within the budget,
        up to ``max_running + urgent_slots`` running; never preempts (pages: free or cache)."""
        chosen = set(map(id, self.policy.outranking(self.waiting, in_flight)))
        items: list[ScheduledItem] = []
        if chosen:
            self._admit(items, self.cfg.max_batch_tokens, lambda r: id(r) in chosen,
                        self._urgent_cap)
        return items

    def _admit(self, items: list[ScheduledItem], budget: int,
               select: Callable[[Request], bool], cap: int | None = None,
               gate: LiveGate | None = None) -> None:
        """Admit selected waiting requests (``admission_key`` order) within ``budget``, while
        fewer than ``cap`` (default ``max_running``) run, those ``gate`` allows."""
        cap, gate = self.cfg.max_running if cap is None else cap, gate or LiveGate(None, 0, True)
        if not self.waiting or budget <= 0:
            return
        ps = self.cfg.page_size
        keyed = []
        for r in (r for r in self.waiting if select(r)):
            m = self.cache.match_prefix(TokenKey.trusted(r.all_ids), r.group.namespace,
                                        record=False)
            keyed.append((self.policy.admission_key(r, m.length), r, m))
        keyed.sort(key=lambda t: t[0])   # stable: FIFO among equals
        inflight = [it.req for it in items if not it.completes] + \
                   [r for r in self.running if r.num_tokens - r.num_computed > 1]   # drafts aside
        for _, req, m in keyed:
            if budget <= 0 or len(self.running) >= cap:
                break
            if not gate.allows(req):
                continue
            if not m.node.alive:    # an earlier admission evicted it: the match is stale
                m = self.cache.match_prefix(TokenKey.trusted(req.all_ids), req.group.namespace,
                                            record=False)
            limit = (req.num_tokens - 1) // ps * ps
            if req.group.logprob_start is not None:
                limit = min(limit, max(0, req.group.logprob_start - 1) // ps * ps)
            cached = PageTable.usable_prefix(self.allocator, m.pages, min(m.length, limit))
            if overlaps_inflight(req.all_ids, cached, inflight, self.cfg.min_shared_prefix):
                continue
            table = PageTable(self.allocator, ps, self.table_stats)
            table.adopt_prefix(m.pages[: cached // ps], cached)
            self.cache.lock(m.node)
            req.page_table, req.lock_node, req.num_computed = table, m.node, cached
            n = min(req.num_uncomputed, budget)
            if not self._reserve(req, n, can_preempt=False):
                req.page_table.free()
                self.cache.unlock(m.node)
                req.page_table, req.lock_node, req.num_computed = None, None, 0
                break
            if req.preemptions == 0 and req.index == 0:
                req.group.cached_tokens = cached
                self.cache.stats.queried_tokens += req.num_tokens
                self.cache.stats.hit_tokens += cached
            self.waiting.remove(req)
            self.retention.resumed(m.node, time.monotonic())   # its own lock covers it now
            self._admit_counter += 1
            req.admit_seq = self._admit_counter
            if req.group.admit_time is None:
                req.group.admit_time = time.perf_counter()
            self.running.append(req)
            items.append(self._item(req, n))
            inflight.append(req)
            gate.admitted(req)
            budget -= n

    def _item(self, req: Request, n: int) -> ScheduledItem:
        start = req.num_computed
        self.policy.charge(req, n)
        ids = req.all_ids + req.draft
        completes = start + n == len(ids)
        rows: list[int] = []
        if req.group.logprob_start is not None:
            # row p predicts token p + 1: prompt logprobs need rows logprob_start-1 .. P-2
            lo = max(start, req.group.logprob_start - 1)
            hi = min(start + n, len(req.prompt_ids) - 1)
            rows = [p - start for p in range(lo, hi)]
        if completes:
            # the sample row, and one row per draft token to verify
            rows += [r for r in range(n - 1 - len(req.draft), n) if not rows or r > rows[-1]]
        return ScheduledItem(req, start, ids[start:start + n], rows)

