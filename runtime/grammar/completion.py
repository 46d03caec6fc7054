"""Shortest completions: from a matcher's state, the fewest tokens that reach an accepting state.

Budget-aware decoding (:mod:`agentlang.runtime.grammar.budget`) needs, after every token, a concrete valid
continuation whose length it can compare with the tokens left. Both backends are byte-level, so a
completion is found as text and then tokenized:

1. **Shortest text** — breadth-first search over single bytes driven by the request's own
   matcher (``accept_token`` on the vocabulary's one-byte tokens, ``rollback`` after), from the
   current state to one where a stop token is allowed. Search nodes are merged by
   :meth:`GrammarMatcher.state_key`: exact for outlines (the automaton state: the search is an
   exact shortest path in bytes), a summary of the parser's last step for xgrammar (states with
   different parser stacks can share a key, so the result is a valid but not always the
   shortest text). The alphabet is tab, newline and printable ASCII except ``\\``, plus any
   text the grammar forces; a constraint that can only be completed through other characters
   has no completion here (see ``None`` below).
2. **Fewest tokens for that text** — dynamic programming over the vocabulary's byte strings
   (not the tokenizer's own merge order: the budget counts tokens, so the split with the fewest
   tokens is the one forced).
3. **Verification** — the tokens are fed to the matcher, which must then allow a stop token; the
   matcher is rolled back, so its state is unchanged on return.

Results are memoised per compiled grammar by state key (verified again on every reuse, since an
xgrammar key may stand for more than one state), so the per-step cost is a key lookup plus the
verification unless the request entered a state never seen before.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch

from agentlang.runtime.grammar.base import bitmask_width
from agentlang.runtime.grammar.token_table import ALPHABET, TokenTable

if TYPE_CHECKING:
    from agentlang.runtime.grammar.base import GrammarMatcher

DEFAULT_MAX_NODES = 500    # depth-first steps of the quick search
DEFAULT_BFS_NODES = 300    # nodes the shortest-first search expands before settling for the quick one
FREE_TEXT_BYTES = 40
_CLASS = {b: ("digit" if chr(b).isdigit() else "upper" if chr(b).isupper()
              else "lower" if chr(b).islower() else "space" if chr(b) in " \t" else None)
          for b in ALPHABET}
_CLOSING_ORDER = b'"}]),0123456789' + bytes(range(ord("a"), ord("z") + 1)) + \
    bytes(range(ord("A"), ord("Z") + 1)) + b" .-+:\n\t"
_CLOSING_RANK = {b: i for i, b in enumerate(_CLOSING_ORDER)} | {ord("["): 91, ord("{"): 92}
_CLASSED = frozenset(b for b, c in _CLASS.items() if c is not None)


class SearchResult(NamedTuple):
    """``tokens`` is a verified completion (``()`` when the output may already end), or
    ``None``: ``exhausted`` says whether the whole reachable space was searched (no valid
    output exists, as far as the alphabet and key merging can tell) or the node limit hit."""

    tokens: tuple[int, ...] | None
    exhausted: bool


class ShortestCompletion:
    """Per compiled grammar: shortest completions from any matcher state (memoised)."""

    def __init__(self, table: TokenTable, max_nodes: int = DEFAULT_MAX_NODES,
                 bfs_nodes: int = DEFAULT_BFS_NODES, closers: tuple[bytes, ...] = ()):
        """``closers``: multi-byte words tried first as one step each (a format's string
        delimiter, e.g. FunctionGemma's ``<escape>``: byte by byte the quick search would
        not find it within ``max_nodes``)."""
        self.table = table
        self.closers = tuple(ids for ids in map(self._byte_split, closers) if ids is not None)
        self.max_nodes = max_nodes
        self.bfs_nodes = bfs_nodes
        self._memo: dict[object, bytes] = {}       # state key -> shortest completion found
        self._quick: dict[object, bytes] = {}      # state key -> a quick completion
        self._start: SearchResult | None = None
        self._scratch = threading.local()   # per-thread mask row: the engine loop searches
                                            # while a server thread checks a new request

    def from_start(self, new_matcher: Callable[[], GrammarMatcher]) -> SearchResult:
        """The search from a fresh matcher (``new_matcher()``), done once and remembered (the
        submit-time budget check of every request with this grammar)."""
        if self._start is None:
            self._start = self.search(new_matcher())
        return self._start

    def search(self, matcher: GrammarMatcher, fits: int | None = None) -> SearchResult:
        """A verified shortest completion from ``matcher``'s state (state unchanged).

        ``fits``: the caller only needs *a* completion of at most ``fits`` tokens. Then a
        state never seen before first gets the quick depth-first completion, and the
        shortest-first search (hundreds of matcher steps) runs only when that one does not
        fit; a quick completion is remembered apart from the shortest ones (a later caller
        with less room must not take it for the shortest)."""
        key = matcher.state_key()
        text = self._memo.get(key)
        if text is not None:
            tokens = self._verified(matcher, text)
            if tokens is not None:
                return SearchResult(tokens, False)
        bound = None if fits is None else self._quick.get(key)    # a quick completion
        tokens = None if bound is None else self._verified(matcher, bound)
        if tokens is None:
            bound = self._closing_first(matcher, merge_runs=True)
            tokens = None if fits is None or bound is None else self._verified(matcher, bound)
            if tokens is not None:
                self._quick[key] = bound
        if tokens is not None and len(tokens) <= fits:
            return SearchResult(tokens, False)
        found, exhausted = self._bfs(matcher, None if bound is None else len(bound))
        found = found if found is not None else bound
        if found is None and matcher.parser_items() is not None:
            # Parser keys merge runs of a rule restarting at every byte, which also merges
            # the steps of a counted repetition ("minLength": 3): try again without.
            found, exhausted = self._closing_first(matcher, merge_runs=False), False
        if found is None:
            return SearchResult(None, exhausted)
        tokens = self._verified(matcher, found)
        if tokens is None:
            return SearchResult(None, False)
        self._memo[key] = found
        return SearchResult(tokens, False)

    def _verified(self, matcher: GrammarMatcher, text: bytes) -> tuple[int, ...] | None:
        """The fewest-token split of ``text`` if the matcher accepts it and may end after it."""
        for tokens in (self.table.fewest_tokens(text), self._byte_split(text)):
            if tokens is not None and _accepts(matcher, tokens):
                return tokens
        return None

    def _byte_split(self, text: bytes) -> tuple[int, ...] | None:
        ids = [self.table.by_bytes.get(text[i:i + 1]) for i in range(len(text))]
        return None if None in ids else tuple(ids)

    def _closing_first(self, matcher: GrammarMatcher, merge_runs: bool) -> bytes | None:
        """A quick completion, not always the shortest: depth-first, bytes tried in
        :data:`_CLOSING_RANK` order (close strings, objects and arrays before opening new
        ones), states already visited skipped; ``None`` after ``max_nodes`` steps."""
        if matcher.is_terminated() or matcher.can_end():
            return b""
        ids: dict = {}
        keys: tuple = (self._node_key(matcher, (), ids, merge_runs),)
        seen = {keys[0]}
        stack: list[tuple[list[tuple[int, ...]], tuple, int]] = []  # (untried, keys, accepted)
        succ = self._successors(matcher, ranked=True)
        steps: list[tuple[int, ...]] = []
        try:
            for _ in range(self.max_nodes):
                if not succ:                              # dead end: back up one step
                    if not stack:
                        return None
                    succ, keys, n = stack.pop()
                    matcher.rollback(n)
                    steps.pop()
                    continue
                step = succ.pop(0)
                n, step_keys = self._advance(matcher, step, keys, ids, merge_runs)
                if n == len(step) and matcher.can_end():
                    matcher.rollback(n)
                    return b"".join(self._text(s) for s in steps + [step])
                if n < len(step) or step_keys[-1] in seen:
                    matcher.rollback(n)
                    continue
                seen.add(step_keys[-1])
                stack.append((succ, keys, n))
                steps.append(step)
                succ, keys = self._successors(matcher, ranked=True), step_keys
            return None
        finally:
            matcher.rollback(sum(n for _, _, n in stack))

    def _advance(self, matcher: GrammarMatcher, step: tuple[int, ...],
                 keys: tuple, ids: dict, merge_runs: bool = True) -> tuple[int, tuple]:
        """Accept ``step``'s tokens (one byte each, or forced text); returns how many were
        accepted and ``keys`` extended by the node key after each."""
        n = 0
        for t in step:
            if not matcher.accept_token(t):
                break
            n += 1
            keys = keys + (self._node_key(matcher, keys, ids, merge_runs),)
        return n, keys

    def _text(self, step: tuple[int, ...]) -> bytes:
        return b"".join(self.table.vocab.token_bytes[t] for t in step)

    def _bfs(self, matcher: GrammarMatcher, bound: int | None) -> tuple[bytes | None, bool]:
        """Shortest-first search over byte continuations; ``(text, exhausted)``. A state whose
        grammar forces some text has that text as its only successor. Nodes with equal
        :meth:`_node_key` are merged (the shorter path is kept); paths of ``bound`` bytes or
        more are not followed."""
        if matcher.is_terminated() or matcher.can_end():
            return b"", False
        interned: dict = {}
        root = self._node_key(matcher, (), interned)
        seen = {root}
        # heap of (text length, insertion order, done, text, node keys at each byte position)
        heap: list[tuple[int, int, bool, bytes, tuple]] = [(0, 0, False, b"", (root,))]
        order = 0
        expanded = 0
        while heap:
            if expanded >= self.bfs_nodes:
                return None, False
            _, _, finished, path, keys = heapq.heappop(heap)
            if finished:
                return path, False
            expanded += 1
            path_ids = self._byte_split(path)
            assert path_ids is not None and all(matcher.accept_token(t) for t in path_ids)
            try:
                for step in self._successors(matcher):
                    n, step_keys = self._advance(matcher, step, keys, interned)
                    done = n == len(step) and matcher.can_end()
                    matcher.rollback(n)
                    text = path + self._text(step)
                    if n < len(step) or not (done or step_keys[-1] not in seen):
                        continue
                    if bound is not None and len(text) >= bound:
                        continue
                    seen.add(step_keys[-1])
                    order += 1
                    heapq.heappush(heap, (len(text), order, done, text, step_keys))
            finally:
                matcher.rollback(len(path_ids))
        return None, True

    @staticmethod
    def _node_key(matcher: GrammarMatcher, path_keys: tuple, ids: dict,
                  merge_runs: bool = True) -> int:
        """The merge key (an id interned in ``ids``, one dict per search) of the matcher's
        state, reached by the search path whose earlier node keys are ``path_keys`` (one per
        byte position from the search root). Exact matchers: their state key. Parser
        matchers: the items, each anchored to the key of the node before its start (where its
        parent item waited), so the key covers the parser stack within the search; a rule
        restarting at every byte (tail recursion, e.g. string content) keeps its anchor, so
        such runs merge (unless not ``merge_runs``)."""
        items = matcher.parser_items()
        if items is None:
            full: object = matcher.state_key()
        else:
            pos, parsed = items
            root = pos - len(path_keys)
            body = tuple((r, q, e, u, s == pos) for r, q, e, s, u in parsed)
            if merge_runs and path_keys and all(s == pos for _, _, _, s, _ in parsed) and \
                    ids[path_keys[-1]] == body:
                return path_keys[-1]
            anchors = tuple(path_keys[s - 1 - root] if 0 <= s - 1 - root < len(path_keys)
                            else ("before", s) for _, _, _, s, _ in parsed)
            full = (body, anchors)
        key = ids.get(full)
        if key is None:
            key = ids[full] = len(ids) // 2
            ids[key] = full[0] if isinstance(full, tuple) and len(full) == 2 else None
        return key

    def _successors(self, matcher: GrammarMatcher, ranked: bool = False) -> list[tuple[int, ...]]:
        """One-byte token steps (``ranked``: in :data:`_CLOSING_RANK` order), or the forced
        text as one step when the grammar forces some."""
        forced = matcher.jump_forward_text().encode()
        if forced:
            ids = self._byte_split(forced)
            if ids is not None:
                return [ids]
        row = getattr(self._scratch, "row", None)
        if row is None:
            width = bitmask_width(self.table.vocab.vocab_size)
            row = self._scratch.row = torch.zeros(1, width, dtype=torch.int32)   # [1, W]
        matcher.fill_mask(row, 0)
        words = row[0].tolist()
        allowed = [(b, tok) for b, tok in self.table.byte_tokens if (words[tok >> 5] >> (tok & 31)) & 1]
        if len(allowed) > FREE_TEXT_BYTES:  # free text: one byte per class stands for the rest
            first: dict[str, int] = {}
            for b, _ in allowed:
                first.setdefault(_CLASS.get(b), b)
            allowed = [bt for bt in allowed if bt[0] not in _CLASSED or first[_CLASS[bt[0]]] == bt[0]]
        if ranked:
            allowed.sort(key=lambda bt: _CLOSING_RANK.get(bt[0], len(_CLOSING_ORDER)))
        return [*self.closers, *((tok,) for _, tok in allowed)]


def _accept_all(matcher: GrammarMatcher, tokens: tuple[int, ...]) -> int:
    """Accept ``tokens`` in order; returns how many were accepted (stops at the first reject)."""
    n = 0
    for t in tokens:
        if not matcher.accept_token(t):
            break
        n += 1
    return n


def _accepts(matcher: GrammarMatcher, tokens: tuple[int, ...]) -> bool:
    n = _accept_all(matcher, tokens)
    ok = n == len(tokens) and matcher.can_end()
    matcher.rollback(n)
    return ok
