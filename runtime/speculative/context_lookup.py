"""Drafts from a request's own context (prompt lookup): continue the earlier copy of the
sequence's current suffix that agrees with it longest.

Agent outputs copy: an extraction repeats spans of the document, a tool call repeats names and
arguments of the history, a code edit rewrites a given function. :class:`ContextLookup` keeps,
for every n-gram of ``min_n .. max_n - 1`` tokens of the sequence (prompt and output), the
position right after its most recent occurrence, and for every ``max_n``-gram the positions
after its last :data:`KEEP` occurrences. A draft looks up the longest n-gram that ends the
sequence; for a ``max_n``-gram it picks, of those occurrences, the one whose preceding tokens
agree with the sequence's end the longest (up to :data:`LOOKBACK` tokens; the most recent among
equals): in a repeated record whose lines share their last few tokens, the copy one record back
predicts the whole line where the nearest copy of the short suffix, inside the same line, does
not. It copies what followed. A copy that runs into the sequence's end continues cyclically (a
repeated pattern of period ``d`` predicts token ``t`` from token ``t - d``), so loops are
drafted whole.

Cost: ``max_n - min_n + 1`` dict updates an appended token; a lookup is at most as many dict
reads, :data:`KEEP` backward comparisons of at most :data:`LOOKBACK` tokens, plus the draft's
length. Deterministic: the draft depends only on the tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

MIN_N = 2     # shortest suffix that may start a copy (a single token matches too often)
MAX_N = 5     # longest suffix looked up first (a longer match predicts better)
KEEP = 8      # occurrences of a max_n-gram a lookup chooses from (the most recent ones)
LOOKBACK = 64 # tokens compared backwards to choose among them


class ContextLookup:
    """The n-gram index of one token sequence, grown with :meth:`extend`."""

    def __init__(self, tokens: Iterable[int] = (), min_n: int = MIN_N, max_n: int = MAX_N):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ContextLookup: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}   # shorter n-gram -> index after its latest
                                                      # sealed copy
        self.recent: dict[tuple[int, ...], deque[int]] = {}  # max_n-gram -> indices after its
                                                             # last KEEP sealed copies, oldest first
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens. The n-grams ending just before an appended token are sealed (their
        continuation is known), so the suffix being looked up never finds itself."""
        seq, after, recent, top = self.tokens, self.after, self.recent, self.max_n
        for t in tokens:
            j = len(seq)
            for n in range(self.min_n, min(top - 1, j) + 1):
                after[tuple(seq[j - n:j])] = j
            if j >= top:
                key = tuple(seq[j - top:j])
                if key not in recent:
                    recent[key] = deque(maxlen=KEEP)
                recent[key].append(j)
            seq.append(t)

    def draft(self, k: int) -> tuple[list[int], int]:
        """Up to ``k`` tokens continuing the sequence, and the length of the suffix that matched
        (0 and ``[]``: no earlier copy of even ``min_n`` tokens)."""
        seq, L = self.tokens, len(self.tokens)
        if k <= 0:
            return [], 0
        where = self.recent.get(tuple(seq[L - self.max_n:])) if L >= self.max_n else None
        if where:
            pos, n = self._closest(where)
            return self._copy(pos, k), n
        for n in range(min(self.max_n - 1, L), self.min_n - 1, -1):
            pos = self.after.get(tuple(seq[L - n:]))
            if pos is not None:
                return self._copy(pos, k), n
        return [], 0

    def _closest(self, where: deque[int]) -> tuple[int, int]:
        """Of the indices after copies of the final ``max_n``-gram, the one whose copy agrees
        with the sequence's end the longest (at most LOOKBACK tokens; the latest among
        equals), and that length."""
        seq, L = self.tokens, len(self.tokens)
        best, best_n = where[-1], -1
        for pos in reversed(where):
            n = self.max_n
            while n < LOOKBACK and pos - n > 0 and seq[pos - n - 1] == seq[L - n - 1]:
                n += 1
            if n > best_n:
                best, best_n = pos, n
        return best, best_n

    def _copy(self, pos: int, k: int) -> list[int]:
        """``k`` tokens from index ``pos`` on, continued cyclically past the sequence's end."""
        seq, L = self.tokens, len(self.tokens)
        period = L - pos                      # the copy's source is this far behind
        out: list[int] = []
        for i in range(k):
            out.append(seq[pos + i] if pos + i < L else out[i - period])
        return out
