"""How many draft tokens to verify: the length that maximizes the step's expected throughput.

A verify step runs ``1 + k`` rows for a request instead of one. With the request's acceptance
rate ``a`` (each draft token kept with probability ``a`` while the ones before it were), it
yields ``E(k) = 1 + a + ... + a^k`` tokens. The step's cost is modelled as linear in its rows,
``t(R) = t1 * (1 + c (R - 1))``: ``c`` (``row_cost``) is what one more row costs relative to a
one-row step — small where a step is memory-bound (the weights are read once whatever the
rows), about ``1 / R`` where it is compute-bound. In a step of ``B`` one-token requests a token
is worth ``v = (1 + c (B - 1)) / B`` step units, so a draft of ``k`` pays when
``(E(k) - 1) v > c k``; :meth:`DraftPolicy.length` returns the ``k <= max_draft`` with the
largest surplus, 0 when none pays. So drafts shorten as the batch grows and stop where a step
is compute-bound (``v`` falls towards ``c``), and a request whose drafts are rejected stops
drafting.

The acceptance rate is a Beta(1, 1) estimate over the request's recent drafts
(:class:`DraftStats`): ``(accepted + 1) / (drafted + 2)`` with both counts decayed by
:data:`FORGET` at each observation, so it follows a request whose text turns from free prose to
a copy and back. Drafts the policy declined still teach it: the lookup's first token is
compared with the token the model then chose (a "shadow" observation, free), so a request that
stopped drafting starts again once its context predicts it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger(__name__)

FORGET = 0.7            # weight of the past in the acceptance estimate, per observation
MAX_DRAFT = 32          # most draft tokens a step verifies (jump-forward's drafts included)
DEFAULT_MAX_DRAFT = 16  # a context-lookup draft's default cap (8 before: an offline replay of the
                        # bench's greedy outputs with the measured step costs: a repeated tool call
                        # is copied a line a step, geomean 1.88 -> 1.93)
# c where it is neither given nor measured (speculative/calibrate.py): one more row of the
# embedded model's native step at a 512-token context, relative to one row, on 2 AVX2 cores
# (bench/speculative.py: 0.26-0.47 for 2-17 rows). CPUs with int8 dot products or AMX tiles
# verify rows more cheaply (~0.15 with AMX): a smaller value drafts longer there.
ROW_COST = 0.35


@dataclass
class DraftStats:
    """One completion's speculation counters (also its ``meta_info``)."""

    drafted: int = 0      # draft tokens verified
    accepted: int = 0     # of those, kept
    verifies: int = 0     # steps that verified a draft
    recent_drafted: float = 0.0   # the estimate's decayed counts (verified and shadow)
    recent_accepted: float = 0.0

    @property
    def acceptance(self) -> float:
        return (self.recent_accepted + 1) / (self.recent_drafted + 2)

    def record(self, drafted: int, accepted: int) -> None:
        """A verified draft: ``accepted`` of its ``drafted`` tokens kept."""
        self.drafted += drafted
        self.accepted += accepted
        self.verifies += 1
        self.observe(drafted, accepted)

    def observe(self, drafted: int, accepted: int) -> None:
        """Evidence for the estimate only (a shadow draft's first token: 1 and 0 or 1)."""
        self.recent_drafted = self.recent_drafted * FORGET + drafted
        self.recent_accepted = self.recent_accepted * FORGET + accepted


class DraftPolicy:
    """``max_draft`` in ``[1, 32]``; ``row_cost`` (``c`` above) in ``(0, 1]``, or None: measured
    by ``measure()`` (:func:`~agentlang.runtime.speculative.calibrate.measure_row_cost`) at the
    first draft decision and kept; until a measurement succeeds (or without ``measure``) the
    decisions use :data:`ROW_COST`."""

    def __init__(self, max_draft: int = DEFAULT_MAX_DRAFT, row_cost: float | None = ROW_COST,
                 measure: Callable[[], float | None] | None = None):
        check_max_draft(max_draft, "max_draft")
        if row_cost is not None:
            check_row_cost(row_cost, "row_cost")
        self.max_draft = max_draft
        self._row_cost = None if row_cost is None else float(row_cost)
        self._measure = measure

    @property
    def row_cost(self) -> float:
        """The ``c`` decisions use now: given, measured, or :data:`ROW_COST` until measured."""
        return ROW_COST if self._row_cost is None else self._row_cost

    def _decision_cost(self) -> float:
        """``row_cost``, measured first where that is asked for and not yet done. A measurement
        that raises is logged and not tried again: tuning never fails a step."""
        if self._row_cost is None and self._measure is not None:
            try:
                self._row_cost = self._measure()
            except Exception as e:               # noqa: BLE001 - any failure: keep the default
                log.warning("speculative row cost not measured (%s: %s); %.2f is used",
                            type(e).__name__, e, ROW_COST)
                self._measure = None
        return self.row_cost

    def length(self, acceptance: float, batch: int, cap: int | None = None) -> int:
        """Draft tokens worth verifying for a request with this ``acceptance`` in a step of
        ``batch`` requests, at most ``cap`` (default ``max_draft``)."""
        c = self._decision_cost()
        value = (1 + c * (max(batch, 1) - 1)) / max(batch, 1)     # a token, in step units
        best, best_gain, gain, term = 0, 0.0, 0.0, 1.0
        for k in range(1, min(self.max_draft, self.max_draft if cap is None else cap) + 1):
            term *= acceptance                  # a^k: the k-th draft token's chance to count
            gain += term * value - c
            if gain > best_gain:
                best, best_gain = k, gain
            elif term * value < c:              # later tokens only lose
                break
        return best


def check_max_draft(value, name: str) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is an integer in ``[1, MAX_DRAFT]``."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DRAFT:
        raise ValueError(f"{name} must be an integer in [1, {MAX_DRAFT}], got {value!r}")


def check_row_cost(value, name: str) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is a number in ``(0, 1]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
