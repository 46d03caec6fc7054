"""Retention holds over the radix cache: they survive eviction, give pages back under pressure
(furthest expected next use first), respect the cap and the TTL, release on continuation, and
leave no reference behind."""

import pytest

from agentlang.runtime.cache.page_allocator import PageAllocator
from agentlang.runtime.cache.page_table import PageTable
from agentlang.runtime.cache.radix_cache import RadixCache
from agentlang.runtime.cache.retention import REASONS, Retention


def make(num_pages=32, page_size=2, max_pages=16):
    alloc = PageAllocator(num_pages)
    cache = RadixCache(alloc, page_size)
    return alloc, cache, Retention(cache, max_pages)


def finish(cache, tokens, ns=()):
    """A request computed ``tokens`` and finished into the cache; returns its deepest node."""
    t = PageTable(cache.allocator, cache.page_size)
    t.reserve(len(tokens), lambda s, d: None)
    t.commit(len(tokens))
    cache.release_into_cache(tokens, t.detach(), ns)
    return cache.match_prefix(tokens, ns, record=False).node


def history(agent, n=8):
    return [100 + agent] + list(range(n - 1))      # distinct first token per agent


def test_a_hold_survives_eviction_and_its_release_makes_it_evictable():
    alloc, cache, ret = make()
    a = finish(cache, history(1))
    b = finish(cache, history(2))
    assert ret.hold("a", a, now=0.0, ttl=10.0)
    assert cache.evictable_pages == 4 and cache.protected_pages == 4
    cache.evict(100)
    assert cache.match_prefix(history(1), record=False).length == 8     # kept
    assert cache.match_prefix(history(2), record=False).length == 0     # plain LRU: gone
    assert ret.held_pages() == 4 and ret.releasable_pages() == 4
    assert ret.release("a", "closed") and len(ret) == 0
    assert cache.protected_pages == 0 and cache.evictable_pages == 4
    cache.check_integrity()
    cache.flush()
    assert alloc.num_used == 0                      # no reference left behind


def test_pressure_releases_the_hold_expected_back_last_first():
    _, cache, ret = make()
    nodes = {k: finish(cache, history(i)) for i, k in enumerate("abc")}
    ret.hold("a", nodes["a"], now=0.0, ttl=60.0, expected_gap=5.0)
    ret.hold("b", nodes["b"], now=0.0, ttl=60.0, expected_gap=30.0)
    ret.hold("c", nodes["c"], now=0.0, ttl=60.0, expected_gap=1.0)
    order = []
    while ret.release_for_pages():
        order.append(next(k for k in "abc" if k not in {h.key for h in ret.holds()}
                          and k not in order))
    assert order == ["b", "a", "c"]
    assert ret.stats.released["pressure"] == 3
    assert not ret.release_for_pages()
    cache.check_integrity()


def test_the_default_expectation_is_the_keys_mean_pause():
    _, cache, ret = make()
    a, b = finish(cache, history(1)), finish(cache, history(2))
    ret.hold("a", a, now=0.0, ttl=60.0)
    assert ret.resumed(a, now=2.0) == 1            # a came back after 2 s
    ret.hold("a", a, now=10.0, ttl=60.0)
    ret.hold("b", b, now=10.0, ttl=60.0)           # unknown key: ttl / 2 = 30 s
    assert ret.held("a").expected_back == pytest.approx(12.0)
    assert ret.held("b").expected_back == pytest.approx(40.0)
    ret.release_for_pages()
    assert ret.held("b") is None and ret.held("a") is not None


def test_continuation_releases_holds_on_its_path_only():
    _, cache, ret = make(page_size=1)
    shared = [7, 7, 7, 7]
    a = finish(cache, shared + [1, 1])
    b = finish(cache, shared + [2, 2])
    ret.hold("a", a, now=0.0, ttl=10.0)
    ret.hold("b", b, now=0.0, ttl=10.0)
    # a request matching only the shared prefix covers neither history
    top = cache.match_prefix(shared + [9], record=False).node
    assert ret.resumed(top, now=1.0) == 0 and len(ret) == 2
    # a's next turn matches all of a's history (and goes deeper)
    deeper = finish(cache, shared + [1, 1, 5, 5])
    assert ret.resumed(deeper, now=1.0) == 1
    assert ret.held("a") is None and ret.held("b") is not None
    assert ret.stats.released["continued"] == 1
    cache.check_integrity()


def test_ttl_expiry_and_replacement():
    _, cache, ret = make()
    a1 = finish(cache, history(1, 4))
    a2 = finish(cache, history(1, 8))
    ret.hold("a", a1, now=0.0, ttl=5.0)
    ret.hold("a", a2, now=1.0, ttl=5.0)            # the newer turn replaces the older
    assert len(ret) == 1 and ret.stats.released["replaced"] == 1
    assert ret.expire(5.9) == 0
    assert ret.expire(6.0) == 1 and len(ret) == 0
    assert ret.stats.released["expired"] == 1
    assert cache.protected_pages == 0
    cache.check_integrity()


def test_the_cap_releases_others_and_refuses_a_history_larger_than_itself():
    _, cache, ret = make(num_pages=64, max_pages=6)
    a, b = finish(cache, history(1)), finish(cache, history(2))     # 4 pages each
    big = finish(cache, history(3, 16))                              # 8 pages
    assert ret.hold("a", a, now=0.0, ttl=10.0)
    assert ret.hold("b", b, now=0.0, ttl=10.0)                       # 8 > 6: a released
    assert ret.held_pages() <= 6 and len(ret) == 1
    assert ret.stats.released["cap"] == 1
    assert not ret.hold("big", big, now=0.0, ttl=10.0)
    assert ret.held("big") is None
    cache.check_integrity()


def test_shared_prefixes_are_counted_once_and_locked_pages_are_not_releasable():
    _, cache, ret = make(page_size=1, max_pages=100)
    shared = [3] * 6
    a = finish(cache, shared + [1, 1])
    b = finish(cache, shared + [2, 2])
    ret.hold("a", a, now=0.0, ttl=10.0)
    ret.hold("b", b, now=0.0, ttl=10.0)
    assert ret.held_pages() == 10                 # 6 shared + 2 + 2
    assert ret.releasable_pages() == 10
    cache.lock(a)                                  # a running request also holds a's path
    assert ret.releasable_pages() == 2             # only b's own pages
    cache.unlock(a)


def test_bad_input():
    _, cache, _ = make()
    with pytest.raises(ValueError, match="max_pages"):
        Retention(cache, -1)
    ret = Retention(cache, 8)
    root = cache.match_prefix([1, 2], record=False).node
    assert not ret.hold("k", root, now=0.0, ttl=5.0)      # nothing cached: nothing to hold
    assert not ret.release("missing", "closed")
    assert set(ret.stats.released) == set(REASONS)


def test_pressure_from_an_admission_releases_only_lower_ranked_holds():
    _, cache, ret = make()
    low, high = finish(cache, history(1)), finish(cache, history(2))
    ret.hold("low", low, now=0.0, ttl=60.0, expected_gap=1.0, rank=0)
    ret.hold("high", high, now=0.0, ttl=60.0, expected_gap=50.0, rank=5)
    assert not ret.release_for_pages(below_rank=0)        # an equal rank waits
    assert ret.release_for_pages(below_rank=5)            # outranks "low" only
    assert ret.held("low") is None and ret.held("high") is not None
    assert not ret.release_for_pages(below_rank=5)
    assert ret.release_for_pages()                        # a running request: any hold
    assert len(ret) == 0


def test_a_hint_after_the_turn_moves_the_hold_in_the_release_order():
    _, cache, ret = make()
    a, b = finish(cache, history(1)), finish(cache, history(2))
    ret.hold("a", a, now=0.0, ttl=60.0, expected_gap=90.0)   # a hint past the TTL is kept
    ret.hold("b", b, now=0.0, ttl=60.0, expected_gap=10.0)
    assert ret.held("a").expected_back == pytest.approx(90.0)
    assert ret.rehint("a", now=5.0, gap=1.0).expected_back == pytest.approx(6.0)
    assert ret.held("a").expires == pytest.approx(60.0)      # the TTL does not move
    assert ret.rehint("missing", now=5.0, gap=1.0) is None
    ret.release_for_pages()
    assert ret.held("b") is None and ret.held("a") is not None   # b is now back last


def test_forgetting_a_closed_key_demotes_its_history_past_the_first_prompt():
    """A closed session's history is dead: evicted before older live entries; its first
    ``keep`` tokens (a prompt others may share) stay in plain LRU order."""
    _, cache, ret = make(page_size=2)
    old = finish(cache, [5, 5, 5, 5, 5, 5])            # the least recently used live entry
    a = finish(cache, history(1, n=8))
    ret.hold("a", a, now=0.0, ttl=60.0)
    assert ret.forget("a", keep=3) == 2                # tokens 4..8 of its 8 (page-aligned)
    assert ret.stats.demoted_pages == 2 and ret.stats.released["closed"] == 1
    cache.evict(1)
    assert cache.match_prefix(history(1, n=8), record=False).length == 4   # its own part went
    assert cache.match_prefix([5] * 6, record=False).length == 6           # live: kept
    b = finish(cache, history(2))
    ret.hold("b", b, now=0.0, ttl=60.0)
    assert ret.forget("b") == 0                         # no first prompt known: plain LRU
    assert ret.forget("never-held", keep=0) == 0
    cache.check_integrity()
    del old
