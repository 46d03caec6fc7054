"""Least-recently-used order over the radix tree's evictable leaves, O(log n) per operation.

A heap of ``(stamp, seq, node)`` with lazy invalidation. A node is offered when it may have
become evictable (created as a leaf, unlocked, or its last child evicted); touching a node
(a newer ``last_access``) pushes nothing. :meth:`LeafQueue.pop` drops entries of nodes that
are no longer evictable and re-queues an entry whose stamp is older than its node's
``last_access``. Every evictable node has exactly one valid entry (the one whose ``seq`` is
``node.queued``; others are stale and dropped when popped) and a valid entry's stamp is never
newer than its node's ``last_access``, so the first valid entry popped with a current stamp is
the evictable leaf used least recently.

:meth:`LeafQueue.demote` moves a node *older* than every live stamp (``DEAD`` below them: a
history no live program will touch again, ``RadixCache.demote``): a new entry replaces its
old one, which goes stale. Touching it later makes it live again.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

from agentlang.runtime.cache.radix_node import TreeNode

DEAD = 1 << 62        # a demoted node's stamp is its last access minus this: older than any live



class LeafQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, TreeNode]] = []
        self._seq = itertools.count(1)       # 0: a node with no entry

    def __len__(self) -> int:
        return len(self._heap)

    def offer(self, node: TreeNode) -> None:
        """Queue ``node`` if it is evictable and not queued yet."""
        if not node.queued and node.evictable:
            self._push(node)

    def demote(self, node: TreeNode) -> bool:
        """Stamp ``node`` older than every live node (if it is not demoted yet) and re-queue
        it when it is evictable or queued. Returns whether it was demoted."""
        if node.last_access < 0:
            return False
        node.last_access -= DEAD
        if node.queued or node.evictable:
            self._push(node)             # the old entry, if any, goes stale
        return True

    def pop(self) -> TreeNode | None:
        """Remove and return the least recently used evictable leaf (None: there is none)."""
        while self._heap:
            stamp, seq, node = heapq.heappop(self._heap)
            if node.queued != seq:
                continue                 # stale: superseded by a demotion's entry
            node.queued = 0
            if not node.evictable:
                continue                 # offered again when it becomes evictable
            if stamp != node.last_access:
                self._push(node)         # touched since it was queued
                continue
            return node
        return None

    def clear(self) -> None:
        for _, _, node in self._heap:
            node.queued = 0
        self._heap.clear()

    def check(self, nodes: Iterable[TreeNode]) -> None:
        """Assert the invariants against every live non-root node of the tree."""
        queued = 0
        for node in nodes:
            assert not node.evictable or node.queued, "evictable leaf missing from the LRU queue"
            queued += bool(node.queued)
        valid = [(stamp, node) for stamp, seq, node in self._heap if node.queued == seq]
        assert queued == len(valid), "LRU queue entries != queued nodes"
        for stamp, node in valid:
            assert node.alive, "LRU queue holds a dead node"
            assert stamp <= node.last_access, "LRU queue stamp newer than the node"

    def _push(self, node: TreeNode) -> None:
        node.queued = next(self._seq)
        heapq.heappush(self._heap, (node.last_access, node.queued, node))
