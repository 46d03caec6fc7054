"""Radix prefix cache: a compressed prefix tree over token ids whose nodes own KV pages.

Ownership contract
------------------
Every page's refcount equals its number of holders. Holders are requests (their page tables)
and the tree, which holds exactly one reference per page that a tree node owns.

* ``match_prefix`` returns the cached pages of the longest cached prefix *without* taking a
  reference. A caller that keeps them increfs them (``PageTable.adopt_prefix``) and
  ``lock``s the returned node while it uses them, *before* anything that may evict.
* ``insert`` makes the tree *adopt* the caller's reference to each page of the newly cached
  part. ``release_into_cache`` is the one call a finished request makes: insert + the
  matching decrefs, after which the request holds no reference to any of its pages.
* ``evict`` drops the tree's reference of the least recently used unlocked leaves.

Keys are checked once where they enter (:class:`TokenKey`). Eviction pops the least recently
used unlocked leaf (:class:`LeafQueue`, O(log n)); ``demote`` puts a dead history first.

Page alignment: with ``page_size > 1`` every edge holds whole pages, so matches and inserts
cover ``len(tokens) // page_size * page_size`` tokens at most; a partially filled trailing
page is never shared through the tree. Namespaces (e.g. ``(model_id, kv_dtype, salt)``) get
separate roots, so equal tokens in different namespaces never share pages.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Hashable, Sequence

from agentlang.runtime.cache.page_allocator import PageAllocator
from agentlang.runtime.cache.radix_lru import LeafQueue
from agentlang.runtime.cache.radix_node import (CacheStats, Eviction, MatchResult, TokenKey, TreeNode,
                                check_namespace, check_tree, namespace_of, own_history, subtree)

__all__ = ["CacheStats", "Eviction", "MatchResult", "RadixCache", "TokenKey", "TreeNode"]


class RadixCache:
    """Prefix tree with page-aligned edges, LRU eviction and per-node locks."""

    def __init__(self, allocator: PageAllocator, page_size: int, enabled: bool = True):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.allocator = allocator
        self.page_size = page_size
        self.enabled = enabled
        self.stats = CacheStats()
        self._roots: dict[Hashable, TreeNode] = {}
        self._owned: set[int] = set()   # every page some node owns
        self._evictable = 0             # pages of nodes with lock_ref == 0
        self._protected = 0             # pages of nodes with lock_ref > 0
        self._clock = itertools.count(1)
        self._lru = LeafQueue()         # the evictable leaves, least recently used first
        self.recent_evictions: deque[Eviction] = deque(maxlen=32)

    # ---- lookup / insert ---------------------------------------------------------------
    def match_prefix(
        self, tokens: Sequence[int], namespace: Hashable = (), *, record: bool = True
    ) -> MatchResult:
        """Longest cached page-aligned prefix of ``tokens`` in ``namespace``.

        Splits the node when the match ends inside its edge and marks every node on the path
        as just used (LRU). Takes no reference: see the module docstring. ``record=False``
        leaves the hit statistics alone (for a re-match of the same request)."""
        key = TokenKey.check(tokens, "match_prefix")
        check_namespace(namespace, "match_prefix")
        node = self._root(namespace)
        length, pages = 0, []
        if self.enabled:
            node, length, pages = self._walk(key, node, next(self._clock))
        if record:
            self.stats.queried_tokens += len(key)
            self.stats.hit_tokens += length
        return MatchResult(length, pages, node)

    def insert(self, tokens: Sequence[int], pages: Sequence[int], namespace: Hashable = ()) -> int:
        """Cache ``tokens`` whose KV is in ``pages``; returns the already-cached length.

        Only the page-aligned part is inserted: ``n = len(tokens) // page_size * page_size``
        tokens with ``pages[:n // page_size]``. The tree *adopts* the caller's reference to
        the newly cached pages ``pages[cached // page_size : n // page_size]`` (no incref).
        The caller still owns, and must decref, ``pages[:cached // page_size]`` (duplicates of
        the tree's pages, or its own extra references to them) and ``pages[n // page_size:]``.
        With the cache disabled nothing is adopted and the return value is ``n`` (everything
        counts as a duplicate), so the same decref rule frees every page.
        ``release_into_cache`` does all of this in one call."""
        key = TokenKey.check(tokens, "insert")
        check_namespace(namespace, "insert")
        pages = list(pages)
        ps = self.page_size
        n = len(key) // ps * ps
        if len(pages) < n // ps:
            raise ValueError(f"insert: {len(pages)} pages cannot hold {n} tokens (page_size {ps})")
        if not self.enabled:
            return n
        tick = next(self._clock)
        node, cached, _ = self._walk(key[:n], self._root(namespace), tick)
        new = pages[cached // ps : n // ps]
        if len(set(new)) != len(new):
            raise ValueError(f"insert: pages contain duplicates: {new}")
        self._check_page_ids(new, "insert")
        for p in new:
            if self.allocator.refcount(p) < 1:
                raise ValueError(f"insert: page {p} is not an allocated page")
            if p in self._owned:
                raise ValueError(f"insert: page {p} is already owned by the cache")
        if new:
            leaf = TreeNode(key=key[cached:n], pages=new, parent=node, last_access=tick)
            node.children[leaf.key[:ps]] = leaf
            self._owned.update(new)
            self._evictable += len(new)
            self._lru.offer(leaf)
        return cached

    def release_into_cache(
        self, tokens: Sequence[int], pages: Sequence[int], namespace: Hashable = ()
    ) -> int:
        """A request hands over its KV: ``pages`` hold the KV of ``tokens`` (in order; extra
        trailing pages, e.g. a partial last page or an unused reservation, are allowed).
        Inserts the page-aligned part and drops every reference the caller held, so afterwards
        the caller holds none of ``pages``. Returns the already-cached length.

        Validates before changing anything: ``pages`` must be distinct pages the caller holds a
        reference to (a page the tree owns needs the tree's reference plus the caller's)."""
        key = TokenKey.check(tokens, "release_into_cache")
        pages = list(pages)
        ps = self.page_size
        if len(pages) < -(-len(key) // ps):
            raise ValueError(
                f"release_into_cache: {len(pages)} pages cannot hold {len(key)} tokens "
                f"(page_size {ps})"
            )
        if len(set(pages)) != len(pages):
            raise ValueError(f"release_into_cache: pages contain duplicates: {pages}")
        self._check_page_ids(pages, "release_into_cache")
        for p in pages:
            need = 2 if p in self._owned else 1
            if self.allocator.refcount(p) < need:
                raise ValueError(
                    f"release_into_cache: page {p} has refcount {self.allocator.refcount(p)}, "
                    "the caller holds no reference to it (released twice?)"
                )
        n_pages = len(key) // ps
        cached = self.insert(key, pages, namespace)
        self.allocator.decref(pages[: cached // ps] + pages[n_pages:])
        return cached

    # ---- locks ---------------------------------------------------------------------------
    def lock(self, node: TreeNode) -> None:
        """Pin ``node`` and its ancestors: they are not evicted until ``unlock``."""
        self._check_node(node, "lock")
        while node is not None:
            if node.lock_ref == 0 and node.parent is not None:
                self._evictable -= len(node.pages)
                self._protected += len(node.pages)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        self._check_node(node, "unlock")
        if node.lock_ref <= 0:
            raise ValueError("unlock: node is not locked (unlocked twice?)")
        while node is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0 and node.parent is not None:
                self._evictable += len(node.pages)
                self._protected -= len(node.pages)
                self._lru.offer(node)
            node = node.parent

    # ---- eviction ------------------------------------------------------------------------
    def evict(self, num_pages: int) -> int:
        """Drop least recently used unlocked leaves (repeatedly, as parents become leaves)
        until ``num_pages`` pages went back to the free list or nothing is evictable.
        Returns the pages actually freed (a page still held by a request is not freed);
        may exceed ``num_pages`` since whole nodes are evicted."""
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 0:
            raise ValueError(f"evict: num_pages must be an int >= 0, got {num_pages!r}")
        return self._evict(num_pages, count=True)

    def demote(self, node: TreeNode, keep: int = 0) -> int:
        """No live program touches the history ending at ``node`` again: its own part past
        ``keep`` tokens (:func:`own_history`) is evicted first until touched. Pages demoted."""
        self._check_node(node, "demote")
        own, cut = own_history(node, keep, self.page_size)
        if cut is not None:
            self._split(*cut)              # the node keeps the part past keep
            own.append(cut[0])
        return sum(len(n.pages) for n in own if self._lru.demote(n))

    def flush(self) -> int:
        """Evict every unlocked node; returns the pages freed. Not counted as evictions."""
        return self._evict(None, count=False)

    def reset(self) -> None:
        """Drop the whole tree (locks included) and the statistics. For tests."""
        for root in self._roots.values():
            for node in subtree(root):
                node.alive = False
        self.allocator.decref(self._owned)
        self._lru.clear()
        self._roots.clear()
        self._owned.clear()
        self._evictable = self._protected = 0
        self.stats = CacheStats()

    # ---- introspection -------------------------------------------------------------------
    @property
    def evictable_pages(self) -> int:
        return self._evictable

    @property
    def protected_pages(self) -> int:
        return self._protected

    @property
    def cached_pages(self) -> int:
        return len(self._owned)

    def owned_pages(self) -> frozenset[int]:
        """Ids of the pages the tree holds a reference to (e.g. for ``page_table.kv_usage``)."""
        return frozenset(self._owned)

    def metrics(self) -> dict[str, float]:
        a = self.allocator
        return {
            "prefix_queried_tokens": self.stats.queried_tokens,
            "prefix_hit_tokens": self.stats.hit_tokens,
            "prefix_hit_rate": self.stats.hit_rate,
            "evicted_pages": self.stats.evicted_pages,
            "cached_pages": self.cached_pages, "evictable_pages": self._evictable,
            "protected_pages": self._protected,
            "pages_total": a.num_pages, "pages_used": a.num_used, "pages_free": a.num_free,
        }

    def roots(self) -> dict[Hashable, TreeNode]:   # each namespace's root (a copy: to draw)
        return dict(self._roots)

    def check_integrity(self) -> None:
        """Assert every structural invariant (cheap: one pass over the tree)."""
        for ns, root in self._roots.items():
            assert root.namespace == ns, "root/namespace mismatch"
        tree = check_tree(self._roots.values(), self.page_size, self.allocator.refcount)
        assert tree.owned == self._owned, "owned-page set out of sync with the tree"
        assert (tree.evictable, tree.protected) == (self._evictable, self._protected), \
            "page counters off"
        self._lru.check(n for root in self._roots.values() for n in subtree(root)
                        if n.parent is not None)

    # ---- internals -----------------------------------------------------------------------
    def _root(self, namespace: Hashable) -> TreeNode:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = TreeNode(key=(), pages=[], parent=None,
                                                     namespace=namespace)
        return root

    def _walk(self, key: tuple[int, ...], node: TreeNode, tick: int):
        """Follow ``key`` from ``node``, splitting at a mid-edge end and touching the path.
        Returns (deepest node, matched length, matched pages)."""
        ps = self.page_size
        n = len(key) // ps * ps
        i, pages = 0, []
        node.last_access = tick
        while i < n:
            child = node.children.get(key[i : i + ps])
            if child is None:
                break
            edge = child.key
            m = 0
            limit = min(len(edge), n - i)
            while m < limit and edge[m] == key[i + m]:
                m += 1
            m = m // ps * ps
            if m < len(edge):
                child = self._split(child, m)
            child.last_access = tick
            pages.extend(child.pages)
            i += m
            node = child
        return node, i, pages

    def _split(self, child: TreeNode, m: int) -> TreeNode:
        """Cut ``child``'s edge after ``m`` tokens; the new upper node is returned and
        ``child`` (still the same object, so callers' handles stay valid) keeps the rest."""
        ps = self.page_size
        parent = child.parent
        upper = TreeNode(key=child.key[:m], pages=child.pages[: m // ps], parent=parent,
                         last_access=child.last_access, lock_ref=child.lock_ref)
        child.key, child.pages, child.parent = child.key[m:], child.pages[m // ps :], upper
        upper.children[child.key[:ps]] = child
        parent.children[upper.key[:ps]] = upper
        return upper

    def _check_page_ids(self, pages: list, op: str) -> None:
        for p in pages:
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < self.allocator.num_pages:
                raise ValueError(f"{op}: invalid page id {p!r}")

    def _check_node(self, node: object, op: str) -> None:
        if not isinstance(node, TreeNode):
            raise ValueError(f"{op}: expected a TreeNode, got {type(node).__name__}")
        if not node.alive:
            raise ValueError(f"{op}: node is no longer in the cache (evicted or reset)")
        root = node
        while root.parent is not None:
            root = root.parent
        if self._roots.get(root.namespace) is not root:
            raise ValueError(f"{op}: node belongs to another cache")

    def _evict(self, num_pages: int | None, count: bool) -> int:
        freed = 0
        while num_pages is None or freed < num_pages:
            node = self._lru.pop()
            if node is None:
                break
            parent = node.parent
            del parent.children[node.key[: self.page_size]]
            freed += len(self.allocator.decref(node.pages))
            self._owned.difference_update(node.pages)
            self._evictable -= len(node.pages)
            if count:
                self.stats.evicted_pages += len(node.pages)
                self.recent_evictions.append(Eviction(time.time(), namespace_of(parent),
                                                      len(node.key), id(parent)))
            node.alive, node.parent = False, None
            self._lru.offer(parent)
        return freed
