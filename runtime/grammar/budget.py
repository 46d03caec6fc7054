"""Budget-aware completion: a constrained output never runs out of tokens before it is valid.

Contract (one :class:`BudgetGuard` per request, next to its matcher): the guard always holds a
*plan*, a verified token sequence that completes the output from the matcher's current state
(:mod:`agentlang.runtime.grammar.completion`), with ``len(plan) <= tokens left``. After each token the
caller accepted into the matcher, :meth:`BudgetGuard.settle` keeps that invariant:

* the token is the plan's next token → the plan shrinks by one (no search);
* otherwise a new plan is searched from the new state; if it fits in the tokens left after
  this one, it replaces the plan (with room to spare, a quick completion will do: the
  shortest one is searched only when the quick one does not fit);
* if it does not fit (or none is found), the token is rolled back out of the matcher and the
  old plan's next token is used instead (a *forced* token; an empty old plan forces a stop
  token: the output is already a complete match).

Because the invariant holds after every token, the output is a complete match when the budget
runs out (``finish_reason`` stays ``"length"``, and the text is valid). A token that did not
have to be replaced is kept, so outputs that finish before the budget matters are identical
with and without the guard. :func:`minimum_tokens` is the submit-time check: the plan from the
start state (``ValueError`` naming the budget field when it does not fit, or naming the
constraint when no valid output exists).
"""

from __future__ import annotations

from typing import NamedTuple

from agentlang.runtime.grammar.base import CompiledGrammar, GrammarMatcher
from agentlang.runtime.grammar.satisfiable import UnsatisfiableConstraint


class BudgetTooSmall(ValueError):
    """The token budget is below the shortest valid output; ``minimum`` says how many."""

    def __init__(self, field: str, budget: int, minimum: int):
        super().__init__(f"{field}: {budget} is below the shortest output this constraint "
                         f"allows ({minimum} tokens); use {field} >= {minimum}")
        self.field = field
        self.minimum = minimum


class Settled(NamedTuple):
    token: int      # the token to append (the sampled one, or the forced replacement)
    forced: bool    # True when the sampled token was replaced


def minimum_tokens(compiled: CompiledGrammar, field: str) -> int | None:
    """Fewest tokens of a valid output (the plan from the start state, searched once per
    compiled grammar), ``None`` when the search gave up (the budget is then not guaranteed for
    this constraint). ``UnsatisfiableConstraint`` naming ``field`` (the constraint's field)
    when the start state allows no token at all."""
    result = compiled.completion.from_start(compiled.new_matcher)
    if result.tokens is not None:
        return len(result.tokens)
    if not compiled.new_matcher().allowed_token_ids():
        raise UnsatisfiableConstraint(f"{field}: no output satisfies this constraint")
    return None


def check_budget(compiled: CompiledGrammar, budget: int, budget_field: str,
                 constraint_field: str) -> int | None:
    """Submit-time check: ``BudgetTooSmall`` naming ``budget_field`` when ``budget`` is below
    the minimum; returns the minimum (``None`` when unknown)."""
    minimum = minimum_tokens(compiled, constraint_field)
    if minimum is not None and budget < minimum:
        raise BudgetTooSmall(budget_field, budget, minimum)
    return minimum


class BudgetGuard:
    """Keeps a request's matcher within reach of a complete match (see the module doc)."""

    def __init__(self, compiled: CompiledGrammar, matcher: GrammarMatcher):
        self._search = compiled.completion
        self._stop = matcher.vocab.stop_ids[0]
        result = self._search.search(matcher)
        self.plan: tuple[int, ...] | None = result.tokens  # None: no plan known, not guarded
        self.forced = 0

    @property
    def active(self) -> bool:
        return self.plan is not None

    def settle(self, matcher: GrammarMatcher, token: int, left: int) -> Settled:
        """``token`` was just accepted by ``matcher``; ``left`` tokens may follow it. Returns
        the token to keep (the matcher's state matches it on return)."""
        if self.plan is None or token in matcher.vocab.stop_ids:
            return Settled(token, False)
        if self.plan and token == self.plan[0]:
            self.plan = self.plan[1:]
            return Settled(token, False)
        found = self._search.search(matcher, fits=left).tokens
        if found is not None and len(found) <= left:
            self.plan = found
            return Settled(token, False)
        matcher.rollback(1)
        forced = self.plan[0] if self.plan else self._stop
        ok = matcher.accept_token(forced)
        assert ok, "the matcher rejected its own verified completion"
        self.plan = self.plan[1:]
        self.forced += 1
        return Settled(forced, True)
