"""Per-sequence page table with copy-on-write, and KV-usage accounting.

A :class:`PageTable` is one request's list of KV pages: page ``j`` holds the K/V of token
positions ``j*page_size .. (j+1)*page_size - 1``. The table holds one reference to each of its
pages (see the ownership contract in :mod:`agentlang.runtime.cache.radix_cache`). After every ``commit`` it
holds exactly ``ceil(num_tokens / page_size)`` pages.

Copy-on-write: ``fork`` shares every page with the children, a partially filled last page
included. The first ``reserve`` that would write into a shared partial page first copies it
to a fresh page (``copy_fn``, i.e. the attention backend's ``copy_pages`` over every layer)
and drops one reference to the shared one. Full pages are never written again, so they stay
shared for good.

Sliding windows: when the allocator carries
:class:`~agentlang.runtime.cache.window_pages.WindowPages` (a model with sliding layers), a table
pins the window pages of ``pages[pin_lo:]`` — the blocks some query of its next tokens may
read: new pages are attached pinned, an adopted prefix pins its last window, and each
``reserve`` first unpins the blocks that fell out of the window of position ``num_tokens``
(after the last step's rollbacks, so ``truncate`` never needs an unpinned block back).
``free`` and ``detach`` drop every pin; the window pages stay resident, idle, until evicted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from agentlang.runtime.cache.page_allocator import PageAllocator, page_states
from agentlang.runtime.cache.radix_cache import RadixCache
from agentlang.runtime.cache.window_pages import first_visible

CopyFn = Callable[[list[int], list[int]], None]  # copy_fn(src_pages, dst_pages)


@dataclass
class PageTableStats:
    """Counters shared by every table of one engine (pass the same object to each)."""

    cow_copies: int = 0


class PageTable:
    def __init__(self, allocator: PageAllocator, page_size: int,
                 stats: PageTableStats | None = None):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.allocator = allocator
        self.page_size = page_size
        self.stats = stats if stats is not None else PageTableStats()
        self.windows = allocator.windows
        self.pages: list[int] = []
        self.num_tokens = 0
        self.pin_lo = 0            # windows: pages[pin_lo:] are pinned by this table
        self._released = False

    @property
    def capacity(self) -> int:
        """Token slots covered by the held pages (>= num_tokens)."""
        return len(self.pages) * self.page_size

    def _pages_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.page_size)

    def _check_live(self, op: str) -> None:
        if self._released:
            raise ValueError(f"PageTable.{op}: the table was already freed or detached")

    @staticmethod
    def usable_prefix(allocator: PageAllocator, pages: Sequence[int], length: int) -> int:
        """How much of a cached prefix (``length`` tokens in ``pages``) a table can adopt:
        all of it, or with sliding windows the longest part whose last window is resident
        (``WindowPages.usable``)."""
        w = allocator.windows
        return length if w is None else w.usable(pages, length)

    def adopt_prefix(self, pages: Sequence[int], length: int) -> None:
        """Start an empty table with a cached prefix: ``length`` tokens in ``pages``
        (e.g. a ``RadixCache.match_prefix`` result). Takes one reference to each page."""
        self._check_live("adopt_prefix")
        if self.pages or self.num_tokens:
            raise ValueError("PageTable.adopt_prefix: the table is not empty")
        pages = list(pages)
        if length < 0 or len(pages) != self._pages_for(length):
            raise ValueError(
                f"PageTable.adopt_prefix: {len(pages)} pages do not hold exactly {length} tokens "
                f"(page_size {self.page_size})"
            )
        if len(set(pages)) != len(pages):
            raise ValueError(f"PageTable.adopt_prefix: pages contain duplicates: {pages}")
        lo = self._window_start(length)
        if self.windows is not None:
            self.windows.pin(pages[lo:])      # WindowPageError (nothing taken) if evicted
        self.allocator.incref(pages)
        self.pages, self.num_tokens, self.pin_lo = pages, length, lo

    def reserve(self, n_new: int, copy_fn: CopyFn) -> list[int]:
        """Make room for ``n_new`` more tokens after ``num_tokens``; returns the pages newly
        allocated (the copy-on-write replacement first, if any).

        If the last page is partially filled and shared, it is replaced by a fresh copy
        (``copy_fn([old], [new])``) and one reference to ``old`` is dropped. On
        ``OutOfPagesError`` (or a failing ``copy_fn``) nothing changes."""
        self._check_live("reserve")
        if n_new < 0:
            raise ValueError(f"PageTable.reserve: n_new must be >= 0, got {n_new}")
        ps = self.page_size
        cow_idx = self.num_tokens // ps if self.num_tokens % ps and n_new else None
        if cow_idx is not None and not self.allocator.is_shared(self.pages[cow_idx]):
            cow_idx = None
        self._slide()
        extra = max(0, self._pages_for(self.num_tokens + n_new) - len(self.pages))
        new = self.allocator.allocate(extra + (cow_idx is not None))
        if self.windows is not None:
            try:
                self.windows.attach(new)
            except BaseException:
                self.allocator.decref(new)
                raise
        if cow_idx is not None:
            old = self.pages[cow_idx]
            try:
                copy_fn([old], [new[0]])
            except BaseException:
                self._drop(new)
                raise
            self.pages[cow_idx] = new[0]
            self._drop([old])
            self.stats.cow_copies += 1
            self.pages.extend(new[1:])
        else:
            self.pages.extend(new)
        return new

    def commit(self, n: int) -> None:
        """The K/V of ``n`` reserved tokens were written: advance ``num_tokens`` and drop any
        reserved page left unused."""
        self._check_live("commit")
        if n < 0 or self.num_tokens + n > self.capacity:
            raise ValueError(
                f"PageTable.commit: cannot commit {n} tokens, {self.capacity - self.num_tokens} "
                "reserved"
            )
        self.num_tokens += n
        self._drop_after(self._pages_for(self.num_tokens))

    def truncate(self, num_tokens: int) -> None:
        """Forget the tokens after ``num_tokens`` (their K/V become garbage) and drop the
        pages no longer needed. A now partially filled shared page is copied on the next write."""
        self._check_live("truncate")
        if not 0 <= num_tokens <= self.num_tokens:
            raise ValueError(f"PageTable.truncate: {num_tokens} not in [0, {self.num_tokens}]")
        self.num_tokens = num_tokens
        self._drop_after(self._pages_for(num_tokens))
        lo = self._window_start(num_tokens)
        if self.windows is not None and lo < self.pin_lo:
            self.windows.pin(self.pages[lo:self.pin_lo])   # WindowPageError if evicted
            self.pin_lo = lo

    def fork(self, n: int) -> list[PageTable]:
        """``n`` children sharing every committed page (the partial last page included)."""
        self._check_live("fork")
        if n < 1:
            raise ValueError(f"PageTable.fork: n must be >= 1, got {n}")
        shared = self.pages[: self._pages_for(self.num_tokens)]
        children = []
        for _ in range(n):
            self.allocator.incref(shared)
            if self.windows is not None:
                self.windows.pin(shared[self.pin_lo:])
            child = PageTable(self.allocator, self.page_size, self.stats)
            child.pages, child.num_tokens, child.pin_lo = list(shared), self.num_tokens, self.pin_lo
            children.append(child)
        return children

    def free(self) -> None:
        """Drop every reference; the table cannot be used afterwards."""
        self._check_live("free")
        self._unpin(self.pages[self.pin_lo:])
        self.allocator.decref(self.pages)
        self.pages, self.num_tokens, self._released = [], 0, True

    def detach(self) -> list[int]:
        """Hand the references over to the caller (e.g. to ``RadixCache.release_into_cache``)
        without dropping them; the table cannot be used afterwards."""
        self._check_live("detach")
        self._unpin(self.pages[self.pin_lo:])
        pages = self.pages
        self.pages, self.num_tokens, self._released = [], 0, True
        return pages

    # ---- sliding windows (no-ops without) -----------------------------------------------
    def _window_start(self, position: int) -> int:
        """Index of the first page a query at ``position`` reads in a sliding layer."""
        w = self.windows
        return 0 if w is None else first_visible(position, w.window) // self.page_size

    def _slide(self) -> None:
        """Unpin the pages before the window of the next token (position ``num_tokens``)."""
        lo = min(self._window_start(self.num_tokens), len(self.pages))
        if lo > self.pin_lo:
            self._unpin(self.pages[self.pin_lo:lo])
            self.pin_lo = lo

    def _unpin(self, pages: list[int]) -> None:
        if self.windows is not None:
            self.windows.unpin(pages)

    def _drop(self, pages: list[int]) -> None:
        """Drop this table's pin and reference of ``pages`` (at or after ``pin_lo``)."""
        self._unpin(pages)
        self.allocator.decref(pages)

    def _drop_after(self, keep: int) -> None:
        if len(self.pages) > keep:
            pinned = self.pages[max(keep, self.pin_lo):]
            self._unpin(pinned)
            self.allocator.decref(self.pages[keep:])
            del self.pages[keep:]
            self.pin_lo = min(self.pin_lo, keep)


class KVUsage(NamedTuple):
    allocated_slots: int   # token slots of every page in use
    stored_tokens: int     # slots that hold a token's K/V
    cow_copies: int

    @property
    def waste_pct(self) -> float:
        """(allocated - stored) / allocated, in percent."""
        if not self.allocated_slots:
            return 0.0
        return 100.0 * (self.allocated_slots - self.stored_tokens) / self.allocated_slots


def kv_usage(allocator: PageAllocator, page_size: int, tables: Iterable[PageTable],
             cached_pages: Iterable[int] = (), stats: PageTableStats | None = None) -> KVUsage:
    """KV waste over the whole pool: every page in use counts ``page_size`` slots; a page holds
    as many tokens as the fullest table using it (tree pages in ``cached_pages`` are full).
    A page in use that no table or tree holds counts as empty."""
    fill: dict[int, int] = {p: page_size for p in cached_pages}
    for t in tables:
        for j, p in enumerate(t.pages):
            n = min(page_size, max(0, t.num_tokens - j * page_size))
            fill[p] = max(fill.get(p, 0), n)
    return KVUsage(
        allocated_slots=allocator.num_used * page_size,
        stored_tokens=sum(fill.values()),
        cow_copies=stats.cow_copies if stats is not None else 0,
    )


def memory_metrics(cache: RadixCache, tables: Iterable[PageTable],
                   stats: PageTableStats) -> dict[str, float]:
    """Every KV-memory metric in one flat dict (for the engine's / server's ``/metrics``):
    prefix-cache hits, pages used/free/evictable/protected, page states (cache-only / private /
    shared, see ``page_states``), evictions, COW copies, KV waste.
    ``tables``: the page tables of the running requests; ``stats``: the engine's shared
    ``PageTableStats``."""
    owned = cache.owned_pages()
    usage = kv_usage(cache.allocator, cache.page_size, tables, owned, stats)
    states = page_states(cache.allocator.refcounts(), owned)
    return cache.metrics() | {
        "pages_cache_only": states.cache_only,
        "pages_private": states.private,
        "pages_shared": states.shared,
        "cow_copies": usage.cow_copies,
        "kv_allocated_slots": usage.allocated_slots,
        "kv_stored_tokens": usage.stored_tokens,
        "kv_waste_pct": usage.waste_pct,
    }
