"""Page allocator: a free list plus one reference count per KV page.

Contract
--------
* A page is *free* iff its refcount is 0; free pages live in the free list exactly once.
* ``allocate(n)`` returns ``n`` distinct free pages, each with refcount 1, or raises
  :class:`OutOfPagesError` without changing any state.
* ``incref(pages)`` adds one reference to each (the pages must be in use).
* ``decref(pages)`` drops one reference each; a page whose count reaches 0 returns to the
  free list. Dropping a reference of a free page raises :class:`PageRefError` and changes nothing.
Owners of references are the requests (sequences) and the radix cache, plus the CUDA-graph
decode's one padding page (:mod:`agentlang.runtime.execution.cuda_graph`, held while graphs are on); the allocator
does not know who holds what, it only counts. A windowed model's allocator carries its
:class:`~agentlang.runtime.cache.window_pages.WindowPages`: a freed page's window page goes with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

if TYPE_CHECKING:
    from agentlang.runtime.cache.window_pages import WindowPages


class OutOfPagesError(RuntimeError):
    """Raised when an allocation asks for more pages than are free."""

    evicting_helps = True    # evicting the radix cache (or releasing its holds) frees some


class PageRefError(ValueError):
    """Raised on a reference-count misuse (decref of a free page, incref of a free page)."""


class PageAllocator:
    """Free list + reference counts over ``num_pages`` pages (ids ``0 .. num_pages-1``)."""

    def __init__(self, num_pages: int, windows: "WindowPages | None" = None):
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        self.num_pages = num_pages
        self.windows = windows     # a windowed model's sliding-layer pages: freed with theirs
        self._refcount = [0] * num_pages
        # Pop from the end: low page ids are handed out first (nicer to debug).
        self._free = list(range(num_pages - 1, -1, -1))

    # ---- queries -------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def refcount(self, page: int) -> int:
        return self._refcount[page]

    def is_shared(self, page: int) -> bool:
        return self._refcount[page] > 1

    # ---- mutation ------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError(f"allocate: n must be >= 0, got {n}")
        if n > len(self._free):
            raise OutOfPagesError(
                f"KV pool out of pages: asked for {n}, {len(self._free)} free of {self.num_pages}"
            )
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._refcount[p] = 1
        return pages

    def incref(self, pages: Iterable[int]) -> None:
        pages = list(pages)
        self._check_in_use(pages, "incref")
        for p in pages:
            self._refcount[p] += 1

    def decref(self, pages: Iterable[int]) -> list[int]:
        """Drop one reference per page; returns the pages that became free."""
        pages = list(pages)
        self._check_in_use(pages, "decref")
        freed = []
        for p in pages:
            self._refcount[p] -= 1
            if self._refcount[p] == 0:
                self._free.append(p)
                freed.append(p)
        if freed and self.windows is not None:
            self.windows.release(freed)
        return freed

    def _check_in_use(self, pages: list[int], op: str) -> None:
        need: dict[int, int] = {}
        for p in pages:
            if not isinstance(p, int) or isinstance(p, bool) or not 0 <= p < self.num_pages:
                raise PageRefError(f"{op}: invalid page id {p!r} (pool has {self.num_pages} pages)")
            need[p] = need.get(p, 0) + 1
        if op == "decref":
            for p, k in need.items():
                if self._refcount[p] < k:
                    raise PageRefError(
                        f"decref: page {p} has refcount {self._refcount[p]}, cannot drop {k} "
                        "(freed twice?)"
                    )
        else:
            for p in need:
                if self._refcount[p] == 0:
                    raise PageRefError(f"{op}: page {p} is free")

    def check_integrity(self) -> None:
        """Assert the free list and the refcounts agree."""
        free = set(self._free)
        assert len(free) == len(self._free), "page on the free list twice"
        for p, rc in enumerate(self._refcount):
            assert rc >= 0, f"page {p} has negative refcount"
            assert (rc == 0) == (p in free), f"page {p}: refcount {rc} but free={p in free}"

    def refcounts_tensor(self) -> torch.Tensor:
        return torch.tensor(self._refcount, dtype=torch.int32)

    def refcounts(self) -> list[int]:
        """A copy of every page's reference count (index = page id)."""
        return list(self._refcount)


class PageStates(NamedTuple):
    """Every page in exactly one of four states (the counts sum to the pool's pages)."""

    free: int          # refcount 0, on the free list
    cache_only: int    # refcount 1 and owned by the radix tree: cached, held by no request
    private: int       # refcount 1, not in the tree: one request's own page
    shared: int        # refcount > 1: tree + request(s), or requests sharing it (copy-on-write)
    codes: bytes       # one ASCII digit per page: b"0" free, b"1" cache_only, b"2" private,
    #                    b"3" shared (the page map)


def page_states(refcounts: Sequence[int], tree_pages: Set[int]) -> PageStates:
    """Classify pages from a refcount copy (``PageAllocator.refcounts``) and the ids of the
    pages the radix tree owns (``RadixCache.owned_pages``)."""
    rc = np.asarray(refcounts, dtype=np.int32)                      # [num_pages]
    codes = np.where(rc == 0, 0, np.where(rc > 1, 3, 2)).astype(np.uint8)
    if tree_pages:
        tree = np.fromiter(tree_pages, dtype=np.int64, count=len(tree_pages))
        codes[tree[rc[tree] == 1]] = 1
    counts = np.bincount(codes, minlength=4)
    return PageStates(int(counts[0]), int(counts[1]), int(counts[2]), int(counts[3]),
                      (codes + ord("0")).tobytes())
