"""The draft length: the throughput model of agentlang.runtime.speculative.policy."""

from __future__ import annotations

import pytest

from agentlang.runtime.speculative import DraftPolicy, DraftStats


def test_length_follows_acceptance():
    p = DraftPolicy(max_draft=8, row_cost=0.15)
    assert p.length(0.99, batch=1) == 8                    # near-certain: the cap
    assert 0 < p.length(0.6, batch=1) < 8
    assert p.length(0.1, batch=1) == 0                     # below the row cost: never pays
    assert p.length(0.99, batch=1, cap=3) == 3


def test_length_shrinks_with_the_batch_and_stops_where_compute_bound():
    p = DraftPolicy(max_draft=8, row_cost=0.15)
    lengths = [p.length(0.8, batch=b) for b in (1, 2, 4, 8, 16, 64)]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] > lengths[-1]
    assert lengths[-1] == 0
    # a step whose rows cost nearly nothing extra (memory-bound) drafts long at any batch
    assert DraftPolicy(8, 0.01).length(0.8, batch=16) >= 4


def test_each_length_is_the_best_surplus():
    """Brute force over k of (E(k) - 1) v - c k."""
    for c in (0.05, 0.15, 0.4):
        p = DraftPolicy(max_draft=16, row_cost=c)
        for a in (0.2, 0.5, 0.7, 0.9):
            for b in (1, 3, 10):
                v = (1 + c * (b - 1)) / b
                gains = [sum(a ** i for i in range(1, k + 1)) * v - c * k for k in range(17)]
                best = max(range(17), key=lambda k: (gains[k], -k))
                assert p.length(a, b) == (best if gains[best] > 0 else 0), (c, a, b)


def test_stats_start_at_the_prior_and_learn():
    s = DraftStats()
    assert s.acceptance == 0.5
    s.record(8, 8)
    assert s.acceptance == 0.9 and (s.drafted, s.accepted, s.verifies) == (8, 8, 1)
    s.record(8, 0)                                # the past weighs FORGET = 0.7
    assert s.acceptance == pytest.approx((8 * 0.7 + 1) / (8 * 0.7 + 8 + 2))
    assert (s.drafted, s.accepted, s.verifies) == (16, 8, 2)
    before = s.acceptance
    for _ in range(10):                           # shadow guesses that came true
        s.observe(1, 1)
    assert s.acceptance > 0.75 > before and s.drafted == 16   # not counted as drafts


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_draft=0), "max_draft"), (dict(max_draft=33), "max_draft"),
    (dict(max_draft=True), "max_draft"), (dict(row_cost=0), "row_cost"),
    (dict(row_cost=1.5), "row_cost"),
])
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DraftPolicy(**kwargs)


def test_a_measured_row_cost_is_asked_for_once_at_the_first_decision():
    calls = []

    def measure():
        calls.append(1)
        return None if len(calls) == 1 else 0.05      # the first try cannot measure (pool short)

    p = DraftPolicy(max_draft=8, row_cost=None, measure=measure)
    assert p.row_cost == 0.35 and calls == []          # reading it measures nothing
    assert p.length(0.8, batch=1) == DraftPolicy(8, 0.35).length(0.8, batch=1)
    assert len(calls) == 1                             # tried, failed: the default decided
    assert p.length(0.8, batch=1) == DraftPolicy(8, 0.05).length(0.8, batch=1)
    p.length(0.8, batch=1)
    assert len(calls) == 2 and p.row_cost == 0.05      # measured once, then kept
    given = DraftPolicy(max_draft=8, row_cost=0.2, measure=measure)
    given.length(0.8, batch=1)
    assert len(calls) == 2                             # a given value is never measured


def test_a_measurement_that_fails_leaves_the_default_and_is_not_retried():
    calls = []

    def measure():
        calls.append(1)
        raise RuntimeError("no device memory for the 9-row step")

    p = DraftPolicy(max_draft=8, row_cost=None, measure=measure)
    assert p.length(0.8, batch=1) == DraftPolicy(8, 0.35).length(0.8, batch=1)
    p.length(0.8, batch=1)
    assert calls == [1] and p.row_cost == 0.35
