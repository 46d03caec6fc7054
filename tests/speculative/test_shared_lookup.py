"""The shared index of recent outputs: drafts from another request's output (longest n-gram
first), per namespace, bounded (LRU); and on the engine: a request that repeats an earlier
request's output drafts from it, outputs unchanged, while another tenant's request does not."""

from __future__ import annotations

import pytest

from agentlang.runtime import Engine, SamplingParams
from agentlang.runtime.speculative import SharedLookup
from agentlang.runtime.weights.model_loader import resolve_model


def test_drafts_what_followed_in_another_output():
    s = SharedLookup()
    s.add("ns", [1, 2, 3, 4, 5, 6, 7])
    assert s.draft("ns", [9, 9, 2, 3], 3) == ([4, 5, 6], 2)
    assert s.draft("ns", [1, 2, 3, 4], 8) == ([5, 6, 7], 4)      # the longest n-gram, whole rest
    assert s.draft("ns", [7, 1], 3) == ([], 0)                   # nothing after 7 1
    assert s.draft("ns", [2, 3], 0) == ([], 0)


def test_namespaces_are_apart_and_the_latest_output_wins():
    s = SharedLookup()
    s.add(("tenant", "a"), [1, 2, 3, 4])
    assert s.draft(("tenant", "b"), [1, 2, 3], 2) == ([], 0)
    s.add(("tenant", "a"), [1, 2, 3, 9])
    assert s.draft(("tenant", "a"), [1, 2, 3], 2) == ([9], 3)


def test_bounded_least_recently_used_first():
    s = SharedLookup(cap=10, span=2, min_n=2, max_n=2)
    s.add("ns", [1, 2, 3])                 # (1 2) -> 3
    s.add("ns", list(range(100, 112)))     # 10 bigrams with a continuation: (1 2) evicted
    assert len(s) == 10 and s.draft("ns", [1, 2], 1) == ([], 0)
    s.draft("ns", [100, 101], 1)           # a hit refreshes its entry
    s.add("ns", [7, 8, 9])                 # evicts the oldest, not the refreshed one
    assert s.draft("ns", [100, 101], 1) == ([102], 2)
    assert s.draft("ns", [101, 102], 1) == ([], 0)


@pytest.mark.parametrize("cap", [-1, 2 ** 25, 1.5, True])
def test_bad_caps_are_named(cap):
    with pytest.raises(ValueError, match="speculative_shared_cap"):
        Engine(speculative_shared_cap=cap)


@pytest.mark.slow
def test_engine_drafts_from_an_earlier_output_per_tenant():
    """Request B asks what request A asked (its own context has no copy of the answer):
    with the shared index B's drafts come from A's output and are accepted; outputs are
    identical to speculation off; a request under another ``cache_salt`` gets none of them."""
    prompt = "Write a short poem about the sea and the stars."
    params = dict(max_tokens=48, temperature=0, ignore_eos=True, speculative=True)
    results = {}
    for cap in (0, 4096):
        eng = Engine(resolve_model("default", "auto").path, weights="auto", kv_budget_mb=64,
                     enable_prefix_cache=False, speculative_shared_cap=cap)
        a = eng.generate(prompt, SamplingParams(**params))
        b = eng.generate(prompt, SamplingParams(**params))
        other = eng.generate(prompt, SamplingParams(**params, cache_salt="tenant-2"))
        off = eng.generate(prompt, SamplingParams(**{**params, "speculative": False}))
        assert a.token_ids == b.token_ids == other.token_ids == off.token_ids
        results[cap] = (b.meta["spec_accepted_tokens"], other.meta["spec_accepted_tokens"],
                        a.meta["spec_accepted_tokens"])
    (b0, o0, a0), (b1, o1, a1) = results[0], results[4096]
    assert a1 == a0 and o1 == o0 == a0          # the first request and another tenant: own context only
    assert b1 >= b0 + 20                        # the repeat copies the earlier output
