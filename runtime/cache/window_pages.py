"""The sliding layers' pages: KV kept for the window only (Gemma 2 / Gemma 3).

A model whose layers attend to a sliding window (``ModelConfig.layer_windows``) keeps its KV in
two page groups of the pool (:class:`~agentlang.runtime.cache.kv_pool.KVPool`): the *global*
layers' pages, one per ``page_size`` tokens of every sequence as for any model, and the
*sliding* layers' pages, fewer. A sliding page is attached to a global page, not to a request:
global page ``p`` holds the global layers' K/V of one block of one token prefix, and window page
``page_map[p]`` (``-1``: none) the sliding layers' K/V of the same block. So the page tables,
the radix tree, copy-on-write forks and preemption keep dealing in global pages only; a sliding
layer reads and writes through ``page_map``.

Lifecycle of a window page (the one lifecycle for sliding windows):

* **attached, pinned** when its global page is allocated for a request's new tokens
  (``PageTable.reserve`` calls :meth:`WindowPages.attach`), or **pinned** again when a request
  adopts a cached prefix whose last window it needs (:meth:`pin`). A pin is a request's claim
  "a query of mine may still read this block"; only the tables pin.
* **idle** (resident, unpinned) once no running request's window reaches the block: a table
  unpins the pages before its window at its next ``reserve`` (when rollbacks of the last step
  are done), and all its pins when it is freed or handed to the radix cache. Idle pages stay as
  the cached window of their prefix — a later request can start after that prefix — and are
  evicted least recently idle first when :meth:`attach` needs pages.
* **released** when its global page is freed (the allocator's ``decref`` calls
  :meth:`release`).

A cached prefix of length ``M`` is usable only if the blocks of positions
``M - window + 1 .. M - 1`` are resident (:meth:`usable`): the scheduler truncates a radix match
to the longest such ``M``. Recomputing a lost window is no way out: each sliding layer below
widens what a position depends on by a window, so an exact recompute covers about
``n_sliding * window`` positions — the whole prompt, usually (why llama.cpp re-prefills on a
hit). Output is therefore identical whatever was evicted; only the hit length changes.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import torch

from agentlang.runtime.cache.page_allocator import OutOfPagesError

DEFAULT_PLAN_WINDOWS = 4   # the default split plans for requests of 4 windows (see window_pool_pages)


class OutOfWindowPagesError(OutOfPagesError):
    """The sliding layers' pages are all pinned by running requests' windows (``attach``
    already evicted the idle ones: evicting the radix cache frees none)."""

    evicting_helps = False


class WindowPageError(ValueError):
    """A window page misuse (pinning a block whose window page was evicted, ...)."""


def first_visible(position: int, window: int) -> int:
    """The first key position a query at ``position`` sees (0 without a window)."""
    return max(0, position - window + 1) if window else 0


def request_window_pages(window: int, page_size: int) -> int:
    """The most window pages one request's table pins between steps: the blocks of its next
    query's window (``window`` keys, a block boundary anywhere) and the one being filled."""
    return -(-(window - 1) // page_size) + 2


def default_fraction(window: int, page_size: int) -> float:
    """Window pages per global page when requests are four windows long."""
    return (window + 2 * page_size) / (DEFAULT_PLAN_WINDOWS * window)


def window_pool_pages(num_pages: int, page_size: int, window: int, max_batch_tokens: int,
                      fraction: float | None = None) -> int:
    """Window pages for a pool of ``num_pages`` global pages: ``fraction`` of them (default
    ``(window + 2 * page_size) / (4 * window)``: requests of four windows fill both groups at
    once), at least one request's window plus a full step's tokens, at most ``num_pages`` (one
    per global page: then the sliding group can never run out first)."""
    if fraction is None:
        fraction = default_fraction(window, page_size)
    least = request_window_pages(window, page_size) + -(-max_batch_tokens // page_size)
    return min(num_pages, max(least, math.ceil(num_pages * fraction)))


class WindowPages:
    """Which global pages have a window page, who pins them, and the idle ones' LRU order."""

    def __init__(self, num_pages: int, num_window_pages: int, page_size: int, window: int):
        if not 1 <= num_window_pages <= num_pages:
            raise ValueError(f"num_window_pages must be in [1, {num_pages}], got {num_window_pages}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.num_pages, self.num_window_pages = num_pages, num_window_pages
        self.page_size, self.window = page_size, window
        self.page_map = torch.full((num_pages,), -1, dtype=torch.long)   # [P] global -> window
        self._map = [-1] * num_pages                                     # the same, for Python
        self._free = list(range(num_window_pages - 1, -1, -1))
        self._pins = [0] * num_pages
        self._idle: OrderedDict[int, None] = OrderedDict()   # resident, unpinned; LRU first
        self.evictions = 0
        self.version = 0           # + 1 at each change of page_map (device copies follow it)

    # ---- queries -------------------------------------------------------------------
    def resident(self, page: int) -> bool:
        return self._map[page] >= 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_idle(self) -> int:
        return len(self._idle)

    def usable(self, pages: Sequence[int], length: int) -> int:
        """The longest page-aligned ``M <= length`` (``length`` tokens in ``pages``, a cached
        prefix) whose last window is resident: the blocks of positions
        ``first_visible(M) .. M - 1``. 0 always qualifies."""
        S = self.page_size
        m = length // S * S
        while m > 0:
            missing = [j for j in range(first_visible(m, self.window) // S, m // S)
                       if self._map[pages[j]] < 0]
            if not missing:
                return m
            m = missing[-1] * S
        return 0

    def metrics(self) -> dict[str, float]:
        pinned = self.num_window_pages - len(self._free) - len(self._idle)
        return {"window_pages_total": self.num_window_pages,
                "window_pages_free": len(self._free), "window_pages_pinned": pinned,
                "window_pages_idle": len(self._idle), "window_evictions": self.evictions}


    # ---- mutation ------------------------------------------------------------------
    def attach(self, pages: Sequence[int]) -> None:
        """Give each of the newly allocated global ``pages`` a window page, pinned once;
        evicts idle pages (least recently idle first) as needed. On
        :class:`OutOfWindowPagesError` nothing changes."""
        if any(self._map[p] >= 0 for p in pages):
            raise WindowPageError(f"attach: a page of {list(pages)} has a window page already")
        short = len(pages) - len(self._free)
        if short > len(self._idle):
            raise OutOfWindowPagesError(
                f"sliding-window KV pages: asked for {len(pages)}, {len(self._free)} free and "
                f"{len(self._idle)} idle of {self.num_window_pages} (the rest are in running "
                "requests' windows)")
        for _ in range(max(0, short)):
            victim, _ = self._idle.popitem(last=False)
            self._drop(victim)
            self.evictions += 1
        for p in pages:
            w = self._free.pop()
            self._map[p] = w
            self.page_map[p] = w
            self._pins[p] = 1
        self.version += 1

    def pin(self, pages: Iterable[int]) -> None:
        """One more pin on each page; each must be resident."""
        pages = list(pages)
        lost = [p for p in pages if self._map[p] < 0]
        if lost:
            raise WindowPageError(f"pin: pages {lost} have no window page (evicted)")
        for p in pages:
            if self._pins[p] == 0:
                del self._idle[p]
            self._pins[p] += 1

    def unpin(self, pages: Iterable[int]) -> None:
        """One pin less on each page; a page left with none becomes idle (most recent)."""
        for p in pages:
            if self._pins[p] <= 0:
                raise WindowPageError(f"unpin: page {p} is not pinned")
            self._pins[p] -= 1
            if self._pins[p] == 0:
                self._idle[p] = None

    def release(self, pages: Iterable[int]) -> None:
        """The global ``pages`` were freed: drop their window pages (the allocator's hook)."""
        for p in pages:
            if self._map[p] < 0:
                continue
            if self._pins[p]:
                raise WindowPageError(f"release: page {p} is freed while pinned {self._pins[p]}x")
            del self._idle[p]
            self._drop(p)

    def _drop(self, page: int) -> None:
        self._free.append(self._map[page])
        self._map[page] = -1
        self.page_map[page] = -1
        self.version += 1

    def check_integrity(self) -> None:
        resident = [p for p in range(self.num_pages) if self._map[p] >= 0]
        assert len(resident) + len(self._free) == self.num_window_pages, "window page lost"
        assert len({self._map[p] for p in resident} | set(self._free)) == self.num_window_pages
        assert set(self._idle) == {p for p in resident if self._pins[p] == 0}, "idle set wrong"
        assert all(self._pins[p] == 0 for p in range(self.num_pages) if self._map[p] < 0)


def window_metrics(windows: WindowPages | None) -> dict[str, float]:
    """``windows.metrics()``, all zeros for a model without sliding layers (fixed keys)."""
    if windows is not None:
        return windows.metrics()
    return dict.fromkeys(("window_pages_total", "window_pages_free", "window_pages_pinned",
                          "window_pages_idle", "window_evictions"), 0)
