"""Drafts from the request's own context: the longest suffix match, its most recent earlier
copy, cyclic continuation of a repeating pattern, never the suffix itself."""

from __future__ import annotations

import pytest

from agentlang.runtime.speculative import ContextLookup


def test_no_copy_no_draft():
    assert ContextLookup([1, 2, 3, 4]).draft(4) == ([], 0)
    assert ContextLookup([]).draft(4) == ([], 0)
    assert ContextLookup([1, 2, 1, 2]).draft(0) == ([], 0)


def test_continues_the_earlier_copy_of_the_suffix():
    look = ContextLookup([7, 8, 9, 10, 11, 3, 7, 8])
    assert look.draft(3) == ([9, 10, 11], 2)
    look.extend([9])                       # the suffix is now (7, 8, 9): a 3-token match
    assert look.draft(2) == ([10, 11], 3)


def test_longest_match_wins_over_a_more_recent_shorter_one():
    # (5, 6) last occurred before 1, but (4, 5, 6) only before 2: the longer match decides
    look = ContextLookup([4, 5, 6, 2, 9, 5, 6, 1, 4, 5, 6])
    assert look.draft(1) == ([2], 3)


def test_most_recent_copy_of_equal_length():
    look = ContextLookup([1, 2, 30, 1, 2, 40, 1, 2])
    assert look.draft(1) == ([40], 2)


def test_a_loop_is_drafted_cyclically():
    look = ContextLookup([1, 2, 3, 1, 2, 3, 1, 2])
    # the latest copy of (1, 2, 3, 1, 2) ends one period back: the pattern goes on past the end
    assert look.draft(7) == ([3, 1, 2, 3, 1, 2, 3], 5)
    assert ContextLookup([5, 5, 5]).draft(4) == ([5, 5, 5, 5], 2)


def test_extend_matches_building_at_once():
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 1, 4, 1, 5]
    grown = ContextLookup()
    for t in seq:
        grown.extend([t])
    whole = ContextLookup(seq)
    assert grown.after == whole.after and grown.draft(5) == whole.draft(5) == ([9, 2, 6, 5, 3], 5)


def test_bad_lengths():
    with pytest.raises(ValueError, match="min_n <= max_n"):
        ContextLookup([], min_n=3, max_n=2)
