"""Least-recently-used order over the radix tree's evictable leaves, O(log n) per operation.

A heap of ``(stamp, seq, node)`` with lazy invalidation. A node is offered when it may have
become evictable (created as a leaf, unlocked, or its last child evicted); touching a node
(a newer ``last_access``) pushes nothing. :meth:`LeafQueue.pop` drops entries of nodes that
are no longer evictable and re-queues an entry whose stamp is older than its node's
``last_access``. Every evictable node has exactly one entry (``node.queued``) and an entry's
stamp is never newer than its node's ``last_access``, so the first entry popped with a current
stamp is the evictable leaf used least recently.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

from agentlang.runtime.cache.radix_node import TreeNode


class LeafQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, TreeNode]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def offer(self, node: TreeNode) -> None:
        """Queue ``node`` if it is evictable and not queued yet."""
        if not node.queued and node.evictable:
            self._push(node)

    def pop(self) -> TreeNode | None:
        """Remove and return the least recently used evictable leaf (None: there is none)."""
        while self._heap:
            stamp, _, node = heapq.heappop(self._heap)
            node.queued = False
            if not node.evictable:
                continue                 # offered again when it becomes evictable
            if stamp != node.last_access:
                self._push(node)         # touched since it was queued
                continue
            return node
        return None

    def clear(self) -> None:
        for _, _, node in self._heap:
            node.queued = False
        self._heap.clear()

    def check(self, nodes: Iterable[TreeNode]) -> None:
        """Assert the invariants against every live non-root node of the tree."""
        queued = 0
        for node in nodes:
            assert not node.evictable or node.queued, "evictable leaf missing from the LRU queue"
            queued += node.queued
        assert queued == len(self._heap), "LRU queue entries != queued nodes"
        for stamp, _, node in self._heap:
            assert node.alive and node.queued, "LRU queue holds a dead node"
            assert stamp <= node.last_access, "LRU queue stamp newer than the node"

    def _push(self, node: TreeNode) -> None:
        node.queued = True
        heapq.heappush(self._heap, (node.last_access, next(self._seq), node))
