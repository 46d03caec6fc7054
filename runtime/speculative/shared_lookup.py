"""Drafts from other requests' outputs: an n-gram index over recent finished outputs, shared by
the requests of one cache namespace.

Agents repeat one another: 32 agents calling the same tools write the same call skeletons, a
second extraction over a similar document writes the first one's keys. A request's own context
(:class:`~agentlang.runtime.speculative.context_lookup.ContextLookup`) cannot know what another
request wrote; :class:`SharedLookup` keeps, for every ``min_n .. max_n``-gram of each finished
output, the ``span`` tokens that followed it there (its latest occurrence), and drafts by the
longest n-gram that ends the asking sequence.

Isolation: entries are keyed by the request's cache namespace (model, dtypes, ``cache_salt`` /
tenant), so one tenant's outputs never draft for another — a draft is verified exactly, so it
could not change an output, but its acceptance would reveal that the text was seen.

Memory: at most ``cap`` entries (:data:`SHARED_CAP`: 65,536 by default, each an n-gram and up
to ``span`` continuation tokens: ~16 MB at most), least recently used evicted first (a hit
refreshes its entry). Cost: ``max_n - min_n + 1`` dict writes per output token at a finish; a
lookup is at most as many dict reads. Deterministic given the finished outputs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from agentlang.runtime.speculative.context_lookup import MAX_N, MIN_N

SHARED_CAP = 65536    # entries (n-gram -> continuation) over all namespaces
SPAN = 16             # continuation tokens kept per entry (DEFAULT_MAX_DRAFT)


class SharedLookup:
    """N-grams of recent finished outputs → what followed them, per namespace (module doc)."""

    def __init__(self, cap: int = SHARED_CAP, span: int = SPAN, min_n: int = MIN_N,
                 max_n: int = MAX_N):
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValueError(f"speculative_shared_cap: must be an integer >= 1, got {cap!r}")
        if not 1 <= min_n <= max_n or span < 1:
            raise ValueError(f"SharedLookup: need 1 <= min_n <= max_n and span >= 1, got "
                             f"{min_n}, {max_n}, {span}")
        self.cap, self.span, self.min_n, self.max_n = cap, span, min_n, max_n
        self.entries: OrderedDict[tuple, tuple[int, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, namespace: Hashable, tokens: Sequence[int]) -> None:
        """Index a finished output: each n-gram of it → the tokens after it (the latest wins)."""
        tokens, entries = list(tokens), self.entries
        for j in range(self.min_n, len(tokens)):            # an n-gram ending before token j
            follow = tuple(tokens[j:j + self.span])
            for n in range(self.min_n, min(self.max_n, j) + 1):
                key = (namespace, tuple(tokens[j - n:j]))
                entries[key] = follow
                entries.move_to_end(key)
        while len(entries) > self.cap:
            entries.popitem(last=False)

    def draft(self, namespace: Hashable, tokens: Sequence[int], k: int) -> tuple[list[int], int]:
        """Up to ``k`` tokens another output wrote after the longest n-gram ending ``tokens``,
        and that n-gram's length (``[]``, 0: none)."""
        L = len(tokens)
        if k <= 0:
            return [], 0
        for n in range(min(self.max_n, L), self.min_n - 1, -1):
            key = (namespace, tuple(tokens[L - n:]))
            follow = self.entries.get(key)
            if follow:
                self.entries.move_to_end(key)
                return list(follow[:k]), n
        return [], 0
