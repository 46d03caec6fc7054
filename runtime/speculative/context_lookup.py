"""Drafts from a request's own context (prompt lookup): continue the most recent earlier copy
of the sequence's current suffix.

Agent outputs copy: an extraction repeats spans of the document, a tool call repeats names and
arguments of the history, a code edit rewrites a given function. :class:`ContextLookup` keeps,
for every n-gram of ``min_n .. max_n`` tokens of the sequence (prompt and output), the position
right after its most recent occurrence; a draft looks up the longest n-gram that ends the
sequence and copies what followed it. A copy that runs into the sequence's end continues
cyclically (a repeated pattern of period ``d`` predicts token ``t`` from token ``t - d``), so
loops are drafted whole.

Cost: ``max_n - min_n + 1`` dict updates an appended token; a lookup is at most as many dict
reads plus the draft's length. Deterministic: the draft depends only on the tokens.
"""

from __future__ import annotations

from collections.abc import Iterable

MIN_N = 2     # shortest suffix that may start a copy (a single token matches too often)
MAX_N = 5     # longest suffix looked up first (a longer match predicts better)


class ContextLookup:
    """The n-gram index of one token sequence, grown with :meth:`extend`."""

    def __init__(self, tokens: Iterable[int] = (), min_n: int = MIN_N, max_n: int = MAX_N):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ContextLookup: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}   # n-gram -> index after its latest sealed copy
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens. The n-grams ending just before an appended token are sealed (their
        continuation is known), so the suffix being looked up never finds itself."""
        seq, after = self.tokens, self.after
        for t in tokens:
            j = len(seq)
            for n in range(self.min_n, min(self.max_n, j) + 1):
                after[tuple(seq[j - n:j])] = j
            seq.append(t)

    def draft(self, k: int) -> tuple[list[int], int]:
        """Up to ``k`` tokens continuing the sequence, and the length of the suffix that matched
        (0 and ``[]``: no earlier copy of even ``min_n`` tokens)."""
        seq, L = self.tokens, len(self.tokens)
        if k <= 0:
            return [], 0
        for n in range(min(self.max_n, L), self.min_n - 1, -1):
            pos = self.after.get(tuple(seq[L - n:]))
            if pos is None:
                continue
            period = L - pos                  # the copy's source is this far behind
            out: list[int] = []
            for i in range(k):
                out.append(seq[pos + i] if pos + i < L else out[i - period])
            return out, n
        return [], 0
