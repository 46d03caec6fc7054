"""A bounded copy of the radix tree for live views (the dashboard), hottest nodes first.

``snapshot_tree(cache, max_nodes)`` must run where nothing mutates the tree (the engine calls it
under its step lock, see ``Engine.snapshot``). Its work is bounded by ``max_nodes``: nodes are
expanded most recently used first (a child is never hotter than its parent, since a match
touches the whole path), so the cut-off leaves the *cold* subtrees collapsed; each shown node
counts the children it hides and their pages. Only public fields of
:class:`~agentlang.runtime.cache.radix_cache.TreeNode` are read.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from typing import NamedTuple

from agentlang.runtime.cache.radix_cache import RadixCache, TreeNode

LABEL_TOKENS = 24   # leading tokens of each edge copied for a text label


class NodeRow(NamedTuple):
    id: int                 # id() of the node: stable while it lives (roots included)
    parent: int             # id() of the parent; 0 for a namespace root
    depth: int              # 0 for a namespace root
    tokens: int             # tokens on this edge
    pages: int              # pages this node owns
    lock_ref: int           # locks on this node and below (> 0: not evictable)
    refcount: int           # refcount of the edge's first page: 1 = the tree alone
    last_access: int        # LRU clock tick (larger = more recent)
    hidden_children: int    # children not expanded (cold subtrees, collapsed)
    hidden_pages: int       # pages those hidden children own themselves
    head: tuple[int, ...]   # the edge's first LABEL_TOKENS token ids
    namespace: Hashable     # set on roots only (None below)


class TreeSnapshot(NamedTuple):
    rows: list[NodeRow]     # parents before children
    cached_pages: int       # every page the tree owns (shown or not)
    shown_pages: int        # pages of the rows above
    truncated: bool         # some nodes were left collapsed


def snapshot_tree(cache: RadixCache, max_nodes: int) -> TreeSnapshot:
    """Up to ``max_nodes`` nodes (namespace roots included), most recently used first."""
    refcount = cache.allocator.refcount
    seq = itertools.count()                               # heap tie-breaker
    heap = [(-root.last_access, next(seq), 0, root) for root in cache.roots().values()]
    heapq.heapify(heap)                                   # (-last_access, seq, depth, node)
    raw: list[tuple] = []                                 # NodeRow fields, hidden ones 0
    shown_pages = 0
    while heap and len(raw) < max_nodes:
        _, _, depth, node = heapq.heappop(heap)
        parent = node.parent
        raw.append((id(node), 0 if parent is None else id(parent), depth, len(node.key),
                    len(node.pages), node.lock_ref,
                    refcount(node.pages[0]) if node.pages else 0, node.last_access,
                    node.key[:LABEL_TOKENS], node.namespace))
        shown_pages += len(node.pages)
        for child in node.children.values():
            heapq.heappush(heap, (-child.last_access, next(seq), depth + 1, child))
    hidden: dict[int, list[int]] = {}                     # parent id -> [children, pages]
    for _, _, _, node in heap:                            # the frontier: left collapsed
        if node.parent is not None:
            h = hidden.setdefault(id(node.parent), [0, 0])
            h[0] += 1
            h[1] += len(node.pages)
    rows = [NodeRow(*r[:8], *hidden.get(r[0], (0, 0)), *r[8:]) for r in raw]
    return TreeSnapshot(rows, cache.cached_pages, shown_pages, bool(heap))
