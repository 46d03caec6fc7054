"""Drafts from the request's own context: the longest suffix match, of its earlier copies the
one agreeing longest (else the most recent), cyclic continuation of a repeating pattern, never
the suffix itself."""

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


def test_of_the_longest_matches_the_copy_agreeing_furthest_back_wins():
    # (2, 3) ends the sequence and occurred twice: last before 7 (preceded by 5), earlier before
    # 9 (preceded by 1, as the end is): that earlier copy agrees over 3 tokens and decides
    look = ContextLookup([1, 2, 3, 9, 5, 2, 3, 7, 1, 2, 3], max_n=2)
    assert look.draft(1) == ([9], 3)
    # a record of lines that share their last tokens: the line one record back is copied
    line = [10, 11, 12, 13, 11, 12, 13, 14]          # (11, 12, 13) twice within the line
    look = ContextLookup(line * 2 + line[:4], max_n=3)
    assert look.draft(4) == ([11, 12, 13, 14], 12)          # back to the sequence's start
    # no agreement beyond the n-gram: the most recent copy, as before
    assert ContextLookup([7, 1, 2, 30, 8, 1, 2, 40, 9, 1, 2], max_n=2).draft(1) == ([40], 2)


def test_only_the_last_keep_copies_are_compared():
    from agentlang.runtime.speculative.context_lookup import KEEP
    # the copy agreeing longest comes first, then KEEP copies agreeing less: it is forgotten
    seq = [5, 1, 2, 99] + [t for i in range(KEEP) for t in (6, 1, 2, 50 + i)] + [5, 1, 2]
    look = ContextLookup(seq, max_n=2)
    assert len(look.recent[(1, 2)]) == KEEP
    assert look.draft(1) == ([50 + KEEP - 1], 2)


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
    assert grown.after == whole.after and grown.recent == whole.recent
    assert grown.draft(5) == whole.draft(5) == ([9, 2, 6, 5, 3], 5)


def test_bad_lengths():
    with pytest.raises(ValueError, match="min_n <= max_n"):
        ContextLookup([], min_n=3, max_n=2)
