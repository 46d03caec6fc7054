"""The radix cache's records: tree nodes, match results, statistics, and token keys.

A :class:`TokenKey` is a token id tuple checked once, where it enters the runtime: user input
goes through :meth:`TokenKey.check` (``ValueError`` naming the operation), ids the runtime
produced itself (validated prompts plus sampled tokens) through :meth:`TokenKey.trusted`.
The cache re-checks only keys that are not ``TokenKey`` s.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(eq=False)
class TreeNode:
    """One edge of the tree: ``key`` tokens whose KV lives in ``pages``
    (``len(pages) * page_size == len(key)``; ``page_size == 1``: one page per token)."""

    key: tuple[int, ...]
    pages: list[int]
    parent: TreeNode | None = field(repr=False)
    last_access: int = 0
    lock_ref: int = 0      # direct locks on this node + locks of every descendant
    alive: bool = True     # False once evicted or reset
    namespace: Hashable = None  # set on roots only
    queued: int = 0        # the seq of its entry in the cache's eviction queue (0: none)
    children: dict[tuple[int, ...], TreeNode] = field(default_factory=dict, repr=False)

    @property
    def evictable(self) -> bool:
        """An unlocked leaf below a root: the eviction candidates."""
        return self.alive and self.parent is not None and not self.children \
            and self.lock_ref == 0


class MatchResult(NamedTuple):
    length: int        # matched tokens (multiple of page_size)
    pages: list[int]   # length // page_size pages, not increfed
    node: TreeNode     # deepest matched node (the namespace root on a miss); lock it to keep pages


class Eviction(NamedTuple):
    """One node ``evict`` dropped (the cache keeps the last 32, for dashboards)."""

    time: float        # time.time() of the eviction
    namespace: Hashable
    tokens: int
    parent_id: int     # id() of the node it hung from


@dataclass
class CacheStats:
    queried_tokens: int = 0   # tokens passed to match_prefix
    hit_tokens: int = 0       # of those, tokens found in the cache
    evicted_pages: int = 0    # pages whose tree reference evict() dropped

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class TokenKey(tuple):
    """A non-empty tuple of non-negative int token ids, already checked."""

    __slots__ = ()

    @classmethod
    def check(cls, tokens: object, op: str) -> TokenKey:
        """Validate user input (a non-empty sequence of non-negative ints); ``ValueError``
        names ``op``. A ``TokenKey`` passes through unchecked."""
        if type(tokens) is cls:
            return tokens
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
            raise ValueError(
                f"{op}: tokens must be a sequence of int token ids, got {type(tokens).__name__}"
                " (convert tensors with .tolist())"
            )
        if len(tokens) == 0:
            raise ValueError(f"{op}: tokens is empty")
        key = []
        for t in tokens:
            if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
                raise ValueError(f"{op}: tokens must be non-negative ints, got {t!r}")
            key.append(int(t))
        return cls(key)

    @classmethod
    def trusted(cls, ids: Sequence[int]) -> TokenKey:
        """Ids the runtime produced or validated already (no per-token check)."""
        return cls(ids)


def check_namespace(namespace: object, op: str) -> None:
    try:
        hash(namespace)
    except TypeError:
        raise ValueError(f"{op}: namespace must be hashable, got {type(namespace).__name__}")


def namespace_of(node: TreeNode) -> Hashable:
    """The namespace of the tree ``node`` hangs in (read off its root)."""
    while node.parent is not None:
        node = node.parent
    return node.namespace


def subtree(root: TreeNode) -> Iterator[TreeNode]:
    """``root`` and every node below it (depth first)."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def own_history(node: TreeNode, keep: int = 0, page_size: int = 1
                ) -> tuple[list[TreeNode], tuple[TreeNode, int] | None]:
    """The nodes only the history ending at ``node`` uses, deepest first: from ``node`` up to
    the first node with another child (a branch point: other histories use it) or starting
    within the history's first ``keep`` tokens (e.g. a prompt others may share); and the node
    that straddles ``keep``, if it is also the history's own, with the page-aligned offset
    past ``keep`` to cut it at (None: no such node). Nothing when ``node`` has children."""
    path = []
    while node.parent is not None:
        path.append(node)
        node = node.parent
    end, below, out = sum(len(n.key) for n in path), None, []
    for n in path:
        if any(c is not below for c in n.children.values()):
            return out, None
        start = end - len(n.key)
        if start < keep:
            cut = -(-(keep - start) // page_size) * page_size
            return out, ((n, cut) if cut < len(n.key) else None)
        out.append(n)
        end, below = start, n
    return out, None


class TreeCensus(NamedTuple):
    owned: set[int]    # pages the nodes hold
    evictable: int     # pages of unlocked nodes
    protected: int     # pages of locked nodes


def check_tree(roots: Iterable[TreeNode], page_size: int,
               refcount: Callable[[int], int]) -> TreeCensus:
    """Assert the structure below each namespace root (links, page alignment, locks, no page
    held twice or free) and count what it holds."""
    ps = page_size
    seen: set[int] = set()
    evictable = protected = 0
    for root in roots:
        assert root.parent is None and root.key == () and root.pages == [], "bad root"
        assert root.alive, "dead root"
        for node in subtree(root):
            assert node.lock_ref >= sum(c.lock_ref for c in node.children.values()), (
                "lock_ref smaller than the children's"
            )
            for k, c in node.children.items():
                assert c.parent is node and c.alive, "broken parent link"
                assert len(c.key) > 0 and len(c.key) % ps == 0, "edge not page-aligned"
                assert k == c.key[:ps], "child stored under a wrong key"
                assert len(c.pages) * ps == len(c.key), "edge length != pages * page_size"
                for p in c.pages:
                    assert p not in seen, f"page {p} owned twice"
                    assert refcount(p) >= 1, f"tree page {p} is free"
                    seen.add(p)
                if c.lock_ref > 0:
                    protected += len(c.pages)
                else:
                    evictable += len(c.pages)
    return TreeCensus(seen, evictable, protected)
