"""Retention: radix-cache locks that keep a paused agent's KV until it continues.

A *hold* is one more lock (:meth:`RadixCache.lock`) on the deepest cached node of a finished
request's tokens, taken for a session key (e.g. one agent's conversation) when its turn ends —
typically in a tool call — and given back when the first of these happens:

* ``continued`` — a request covering the held history was admitted (it locked its own
  prefix first): the key's next turn, matched by its tokens;
* ``replaced`` — the key finished another turn (its newer hold replaces this one);
* ``closed`` — the session closed;
* ``expired`` — the hold's time-to-live ran out (a client that never returns costs its TTL);
* ``pressure`` — a request needs pages that only released holds can give: a running request
  (it is never preempted for a hold), a waiting one that outranks the hold's turn (a higher
  priority never waits for protected pages), or any waiting one when nothing runs (no one
  would make progress); an equal- or lower-priority arrival waits while others run, which is
  what keeps a paused agent's history (:meth:`Retention.release_for_pages`);
* ``cap`` — holding a new history would put more than ``max_pages`` pages under holds;
* ``limit`` — schedule policy ``live`` sheds a paused program over its live-program limit
  (``scheduler/live_programs.py``);
* ``flushed`` — the cache is being flushed (``Engine.flush_cache``: every hold goes).

Order of release under pressure and at the cap (*furthest next use first*, Belady's rule on
what the program tells us): each hold has an expected resume time, ``created + expected_gap``
(the caller's hint, or the key's recent mean pause between a turn's end and its next request),
and the hold expected back last goes first; equal expectations release the larger hold first.
With ``cheapest_first`` (schedule policy ``live``, whose released programs wait for a free
live slot rather than resuming when their tool returns, so the expected resume time no longer
says when they are needed) the smallest hold goes first: the history cheapest to recompute.
A hint may be sent after the turn ended (:meth:`Retention.rehint`), e.g. once the program knows
which tool runs and for how long.

When a session closes its held history is *dead* past its first prompt (no live program will
touch it): :meth:`Retention.forget` demotes it in the tree's LRU order, so those pages go
before any live one; the first prompt (a system prompt, few-shot examples others may share)
stays plain LRU.

A released hold's pages stay in the tree as plain LRU entries (evicted only when needed), so
release never loses KV by itself. With sliding windows (``cache/window_pages.py``) a hold also
pins the window pages of its history's last window, so the continuation's hit is whole. Stepping thread only (or under the engine's step lock).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

from agentlang.runtime.cache.radix_cache import RadixCache
from agentlang.runtime.cache.radix_node import TreeNode
from agentlang.runtime.cache.window_pages import first_visible

REASONS = ("continued", "replaced", "closed", "expired", "pressure", "cap", "limit",
           "flushed")
GAP_MEMORY = 0.5     # weight of the newest pause in a key's mean pause (exponential average)
MAX_KEYS_REMEMBERED = 4096   # keys whose mean pause is kept (oldest forgotten first)


@dataclass(eq=False)
class Hold:
    key: Hashable
    node: TreeNode
    created: float                 # seconds (the caller's clock)
    expires: float
    expected_back: float           # when the key is expected to continue
    pages: int                     # pages on the node's path (the history it keeps)
    rank: int = 0                  # the finished turn's priority rank (higher first)
    window: tuple[int, ...] = ()   # sliding windows: the pages whose window pages it pins


@dataclass
class RetentionStats:
    released: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    demoted_pages: int = 0        # pages of closed sessions' histories marked dead


class Retention:
    """Holds keyed by session key over ``cache``; at most ``max_pages`` distinct pages held;
    ``cheapest_first``: the release order (module doc)."""

    def __init__(self, cache: RadixCache, max_pages: int, cheapest_first: bool = False):
        if not isinstance(max_pages, int) or isinstance(max_pages, bool) or max_pages < 0:
            raise ValueError(f"max_pages must be an integer >= 0, got {max_pages!r}")
        self.cache = cache
        self.max_pages = max_pages
        self.cheapest_first = cheapest_first
        self.stats = RetentionStats()
        self._holds: dict[Hashable, Hold] = {}
        self._gaps: dict[Hashable, float] = {}      # mean pause per key (seconds)
        self._by_node: dict[int, list[Hold]] = {}  # id(node) -> holds on that node
        self._next_expiry = float("inf")

    # ---- taking and giving back ----------------------------------------------------------
    def hold(self, key: Hashable, node: TreeNode, now: float, ttl: float,
             expected_gap: float | None = None, rank: int = 0) -> bool:
        """Hold ``node`` (and its ancestors) for ``key`` until ``now + ttl``; replaces the key's
        previous hold. ``expected_gap``: seconds until the key is expected to continue (default:
        its mean observed pause, else ``ttl / 2``); ``rank``: the turn's priority rank.
        Returns False when nothing is held (a root
        node, ``ttl <= 0``, or a history larger than the cap)."""
        self.release(key, "replaced")
        pages = _path_pages(node)
        if node.parent is None or ttl <= 0 or pages > self.max_pages:
            return False
        gap = expected_gap if expected_gap is not None else self._gaps.get(key, ttl / 2)
        h = Hold(key, node, now, now + ttl, now + gap, pages, rank, self._pin_window(node))
        self.cache.lock(node)
        self._holds[key] = h
        self._by_node.setdefault(id(node), []).append(h)
        self._next_expiry = min(self._next_expiry, h.expires)
        while self.held_pages() > self.max_pages:
            self._release(self._furthest(exclude=h), "cap")
        return True

    def resumed(self, node: TreeNode, now: float) -> int:
        """A request was admitted with ``node`` as its deepest cached prefix node (it holds its
        own lock on it now): every hold at ``node`` or above it is given back (``continued``:
        the request covers that history) and each key's pause is remembered for its next
        expected-resume estimate. Returns how many were released."""
        released = 0
        for n in _path(node):
            for h in list(self._by_node.get(id(n), ())):
                pause = max(0.0, now - h.created)
                old = self._gaps.pop(h.key, None)         # re-inserted last: newest remembered
                self._gaps[h.key] = pause if old is None else \
                    GAP_MEMORY * pause + (1 - GAP_MEMORY) * old
                if len(self._gaps) > MAX_KEYS_REMEMBERED:
                    del self._gaps[next(iter(self._gaps))]
                self._release(h, "continued")
                released += 1
        return released

    def release(self, key: Hashable, reason: str) -> bool:
        """Give back ``key``'s hold, if any (``reason``: one of :data:`REASONS`)."""
        h = self._holds.get(key)
        if h is None:
            return False
        self._release(h, reason)
        return True

    def rehint(self, key: Hashable, now: float, gap: float) -> Hold | None:
        """``key`` now expects to continue ``gap`` seconds after ``now`` (a next-use hint sent
        after its turn ended, e.g. once the tool it called is known): its hold's place in the
        release order moves (its TTL does not). The hold, or None when ``key`` holds nothing."""
        h = self._holds.get(key)
        if h is not None:
            h.expected_back = now + gap
        return h

    def forget(self, key: Hashable, keep: int | None = None) -> int:
        """``key`` is gone for good (its session closed): release and drop its statistics.
        With ``keep`` (tokens), the history it held past its first ``keep`` tokens is dead:
        evicted before any other (:meth:`RadixCache.demote`). Returns the pages demoted."""
        h = self._holds.get(key)
        self.release(key, "closed")
        self._gaps.pop(key, None)
        if h is None or keep is None or not h.node.alive:
            return 0
        demoted = self.cache.demote(h.node, keep)
        self.stats.demoted_pages += demoted
        return demoted

    def expire(self, now: float) -> int:
        """Release every hold whose TTL ran out by ``now``; returns how many. O(1) while none
        is due."""
        if now < self._next_expiry:
            return 0
        due = [h for h in self._holds.values() if h.expires <= now]
        for h in due:
            self._release(h, "expired")
        self._next_expiry = min((h.expires for h in self._holds.values()), default=float("inf"))
        return len(due)

    def release_all(self, reason: str) -> int:
        """Give back every hold; returns how many."""
        holds = list(self._holds.values())
        for h in holds:
            self._release(h, reason)
        return len(holds)

    def release_for_pages(self, below_rank: int | None = None) -> bool:
        """Pages are short: release the hold expected back last (``pressure``), among those of
        rank below ``below_rank`` (None: any). False when there is none. The caller evicts and
        retries, releasing more while it must."""
        h = self._furthest(below_rank=below_rank)
        if h is None:
            return False
        self._release(h, "pressure")
        return True

    # ---- introspection -----------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._holds)

    def held(self, key: Hashable) -> Hold | None:
        return self._holds.get(key)

    def holds(self) -> list[Hold]:
        return list(self._holds.values())

    def held_pages(self) -> int:
        """Distinct pages on the paths of all holds (shared prefixes counted once)."""
        return len(self._pages_under(self._holds.values()))

    def releasable_pages(self) -> int:
        """Pages that releasing every hold would make evictable: those of nodes locked by
        holds only (not by a running request or a pinned prefix)."""
        count: dict[int, int] = {}
        nodes: dict[int, TreeNode] = {}
        for h in self._holds.values():
            for n in _path(h.node):
                count[id(n)] = count.get(id(n), 0) + 1
                nodes[id(n)] = n
        return sum(len(n.pages) for i, n in nodes.items() if n.lock_ref == count[i])

    # ---- internals ---------------------------------------------------------------------
    def _release(self, h: Hold, reason: str) -> None:
        del self._holds[h.key]
        same = self._by_node[id(h.node)]
        same.remove(h)
        if not same:
            del self._by_node[id(h.node)]
        if h.node.alive:
            self.cache.unlock(h.node)
        if h.window:
            self.cache.allocator.windows.unpin(h.window)
        self.stats.released[reason] += 1

    def _pin_window(self, node: TreeNode) -> tuple[int, ...]:
        """Pin the window pages of the last window of ``node``'s history (all resident, else
        nothing: that window is lost already); the pinned pages."""
        windows = self.cache.allocator.windows
        if windows is None:
            return ()
        pages = [p for n in reversed(list(_path(node))) for p in n.pages]     # root first
        S = self.cache.page_size
        tail = tuple(pages[first_visible(len(pages) * S, windows.window) // S:])
        if not all(windows.resident(p) for p in tail):
            return ()
        windows.pin(tail)
        return tail

    def _furthest(self, exclude: Hold | None = None,
                  below_rank: int | None = None) -> Hold | None:
        cands = [h for h in self._holds.values() if h is not exclude
                 and (below_rank is None or h.rank < below_rank)]
        if not cands:
            return None
        if self.cheapest_first:
            return min(cands, key=lambda h: (h.pages, -h.expected_back))
        return max(cands, key=lambda h: (h.expected_back, h.pages))

    @staticmethod
    def _pages_under(holds) -> set[int]:
        seen: set[int] = set()
        done: set[int] = set()
        for h in holds:
            for n in _path(h.node):
                if id(n) in done:
                    break                       # the rest of this path is counted already
                done.add(id(n))
                seen.update(n.pages)
        return seen


def _path(node: TreeNode) -> Iterator[TreeNode]:
    """``node`` and its ancestors below the namespace root, deepest first."""
    while node is not None and node.parent is not None:
        yield node
        node = node.parent


def _path_pages(node: TreeNode) -> int:
    return sum(len(n.pages) for n in _path(node))
