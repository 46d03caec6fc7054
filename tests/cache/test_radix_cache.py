"""Unit tests of the radix prefix cache: splits, LRU, locks, namespaces, ownership, bad input."""

import random

import pytest

from agentlang.runtime.cache.page_allocator import PageAllocator, PageRefError
from agentlang.runtime.cache.page_table import PageTable
from agentlang.runtime.cache.radix_cache import RadixCache, TokenKey
from agentlang.runtime.cache.radix_node import subtree


def nocopy(src, dst):
    pass


def make(page_size=1, num_pages=64, enabled=True):
    alloc = PageAllocator(num_pages)
    return alloc, RadixCache(alloc, page_size, enabled=enabled)


def cache_request(cache, tokens, namespace=()):
    """Simulate a request that computes ``tokens`` from scratch and finishes into the cache."""
    t = PageTable(cache.allocator, cache.page_size)
    t.reserve(len(tokens), nocopy)
    t.commit(len(tokens))
    pages = list(t.pages)
    cache.release_into_cache(tokens, t.detach(), namespace)
    return pages


def test_split_in_the_middle_of_an_edge():
    alloc, cache = make(page_size=1)
    pages = cache_request(cache, [1, 2, 3, 4, 5, 6])
    (edge,) = cache._root(()).children.values()
    assert edge.key == (1, 2, 3, 4, 5, 6)

    m = cache.match_prefix([1, 2, 3, 9])
    assert m.length == 3 and m.pages == pages[:3]
    assert m.node.key == (1, 2, 3) and m.node.pages == pages[:3]
    (rest,) = m.node.children.values()
    assert rest is edge and rest.key == (4, 5, 6) and rest.pages == pages[3:]
    assert rest.parent is m.node
    cache.check_integrity()

    # A diverging insert at the split point adds a sibling; the full key still matches.
    cache_request(cache, [1, 2, 3, 7, 8])
    assert sorted(c.key for c in m.node.children.values()) == [(4, 5, 6), (7, 8)]
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).pages == pages
    cache.check_integrity()


def test_split_is_page_aligned():
    alloc, cache = make(page_size=4)
    toks = list(range(12))
    pages = cache_request(cache, toks + [99, 98])   # 14 tokens: 3 full pages + a partial one
    assert cache.cached_pages == 3 and alloc.num_used == 3  # the partial page was freed
    m = cache.match_prefix(toks[:6] + [50, 51, 52])  # diverges inside page 1
    assert m.length == 4 and m.pages == pages[:1]
    assert m.node.key == tuple(range(4))
    m = cache.match_prefix(toks[:11])  # 11 tokens: only 2 whole pages can match
    assert m.length == 8 and m.pages == pages[:2]
    cache.check_integrity()


def test_insert_returns_cached_length_and_adopts_only_the_new_part():
    alloc, cache = make(page_size=2)
    first = cache_request(cache, [1, 2, 3, 4])
    # Second request shares the first 2 pages (recomputed: its own duplicate pages).
    t = PageTable(alloc, 2)
    t.reserve(7, nocopy)
    t.commit(7)
    dup = list(t.pages)
    cached = cache.release_into_cache([1, 2, 3, 4, 5, 6, 7], t.detach())
    assert cached == 4
    for p in dup[:2] + dup[3:]:
        assert alloc.refcount(p) == 0          # duplicates and the partial page were freed
    assert alloc.refcount(dup[2]) == 1         # adopted by the tree
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).pages == first + [dup[2]]
    cache.check_integrity()
    alloc.check_integrity()


def test_adopted_prefix_round_trip_keeps_refcounts_exact():
    alloc, cache = make(page_size=4)
    cache_request(cache, list(range(8)))
    m = cache.match_prefix(list(range(8)) + [42, 43])
    t = PageTable(alloc, 4)
    t.adopt_prefix(m.pages, m.length)
    cache.lock(m.node)
    assert all(alloc.refcount(p) == 2 for p in m.pages)
    assert cache.protected_pages == 2 and cache.evictable_pages == 0
    t.reserve(2, nocopy)
    t.commit(2)
    cached = cache.release_into_cache(list(range(8)) + [42, 43], t.detach())
    cache.unlock(m.node)
    assert cached == 8
    assert all(alloc.refcount(p) == 1 for p in m.pages)
    assert alloc.num_used == 2 and cache.evictable_pages == 2
    cache.check_integrity()
    assert cache.flush() == 2 and alloc.num_free == alloc.num_pages


def test_lru_order_match_protects_from_next_eviction():
    alloc, cache = make(page_size=1)
    a = cache_request(cache, [1, 1, 1])
    b = cache_request(cache, [2, 2, 2])
    c = cache_request(cache, [3, 3, 3])
    cache.match_prefix([1, 1, 1])          # touch a: b is now the least recently used
    assert cache.evict(3) == 3
    assert all(alloc.refcount(p) == 0 for p in b)
    assert all(alloc.refcount(p) == 1 for p in a + c)
    assert cache.evict(1) == 3             # whole node: c (older than a)
    assert all(alloc.refcount(p) == 0 for p in c)
    assert cache.match_prefix([1, 1, 1]).length == 3
    assert cache.stats.evicted_pages == 6
    cache.check_integrity()


def test_eviction_walks_up_as_parents_become_leaves():
    alloc, cache = make(page_size=1)
    cache_request(cache, [1, 2, 3, 4])
    cache_request(cache, [1, 2, 5, 6])     # splits: [1,2] -> {[3,4], [5,6]}
    assert cache.evict(100) == 6
    assert alloc.num_free == alloc.num_pages and cache.cached_pages == 0
    cache.check_integrity()


def test_locked_nodes_survive_eviction():
    alloc, cache = make(page_size=2)
    pages = cache_request(cache, [1, 2, 3, 4, 5, 6])
    m = cache.match_prefix([1, 2, 3, 4])   # splits; lock the upper half
    cache.lock(m.node)
    assert cache.protected_pages == 2 and cache.evictable_pages == 1
    assert cache.evict(10) == 1            # only the unlocked leaf goes, no exception
    assert cache.evict(10) == 0            # nothing left that may go
    assert [alloc.refcount(p) for p in pages] == [1, 1, 0]
    cache.check_integrity()
    cache.unlock(m.node)
    assert cache.evict(10) == 2 and alloc.num_free == alloc.num_pages
    cache.check_integrity()


def test_lock_of_a_descendant_protects_the_path():
    alloc, cache = make(page_size=1)
    cache_request(cache, [1, 2, 3])
    leaf = cache.match_prefix([1, 2, 3]).node
    cache.match_prefix([1, 9])             # split: [1] -> [2,3]
    cache.lock(leaf)
    assert cache.evict(10) == 0 and cache.protected_pages == 3
    cache.unlock(leaf)
    assert cache.evict(10) == 3


def test_namespace_isolation():
    alloc, cache = make(page_size=2)
    ns_a = ("smollm2", "bfloat16", None)
    ns_b = ("smollm2", "int8", None)
    ns_c = ("smollm2", "bfloat16", "tenant-7")
    toks = [5, 6, 7, 8]
    pa = cache_request(cache, toks, ns_a)
    assert cache.match_prefix(toks, ns_b).length == 0
    assert cache.match_prefix(toks, ns_c).length == 0
    pb = cache_request(cache, toks, ns_b)
    assert set(pa).isdisjoint(pb)
    assert cache.match_prefix(toks, ns_a).pages == pa
    assert cache.match_prefix(toks, ns_b).pages == pb
    assert cache.match_prefix(toks).length == 0   # default namespace is separate too
    cache.check_integrity()


def test_disabled_cache_never_hits_and_frees_everything():
    alloc, cache = make(page_size=4, enabled=False)
    cache_request(cache, list(range(10)))
    assert alloc.num_free == alloc.num_pages
    m = cache.match_prefix(list(range(10)))
    assert m.length == 0 and m.pages == []
    assert cache.stats.queried_tokens == 10 and cache.stats.hit_rate == 0.0
    cache.check_integrity()


def test_metrics_and_hit_rate():
    alloc, cache = make(page_size=1)
    cache_request(cache, [1, 2, 3, 4])
    cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])
    cache.match_prefix([1, 2], record=False)
    m = cache.metrics()
    assert m["prefix_queried_tokens"] == 8 and m["prefix_hit_tokens"] == 4
    assert m["prefix_hit_rate"] == 0.5
    assert m["pages_used"] == 4 and m["pages_free"] == 60 and m["cached_pages"] == 4
    assert m["evictable_pages"] == 4 and m["protected_pages"] == 0


def test_reset_drops_everything():
    alloc, cache = make(page_size=1)
    cache_request(cache, [1, 2, 3])
    node = cache.match_prefix([1, 2]).node
    cache.lock(node)
    cache.reset()
    assert alloc.num_free == alloc.num_pages and cache.stats.queried_tokens == 0
    with pytest.raises(ValueError, match="no longer in the cache"):
        cache.unlock(node)
    cache.check_integrity()


# ---- bad input: clear exception, structure unchanged -----------------------------------------
@pytest.mark.parametrize("bad", ["abc", b"ab", 7, None, [1, "2"], [1.5], [True], [-1], {1, 2}])
def test_bad_key_types(bad):
    alloc, cache = make()
    cache_request(cache, [1, 2, 3])
    for call in (lambda: cache.match_prefix(bad), lambda: cache.insert(bad, [0, 1, 2])):
        with pytest.raises(ValueError, match="tokens"):
            call()
    cache.check_integrity()
    assert cache.match_prefix([1, 2, 3]).length == 3


def test_empty_key():
    alloc, cache = make()
    with pytest.raises(ValueError, match="tokens is empty"):
        cache.match_prefix([])
    with pytest.raises(ValueError, match="tokens is empty"):
        cache.insert((), [])
    cache.check_integrity()


def test_unhashable_namespace():
    alloc, cache = make()
    with pytest.raises(ValueError, match="namespace must be hashable"):
        cache.match_prefix([1], namespace=["model"])


def test_unlock_of_unlocked_node():
    alloc, cache = make()
    cache_request(cache, [1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).node
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(node)
    cache.lock(node)
    cache.unlock(node)
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(node)
    cache.check_integrity()
    assert cache.evictable_pages == 3 and cache.protected_pages == 0


def test_lock_of_evicted_or_foreign_node():
    alloc, cache = make()
    _, other = make()
    cache_request(cache, [1, 2])
    cache_request(other, [1, 2])
    foreign = other.match_prefix([1, 2]).node
    with pytest.raises(ValueError, match="another cache"):
        cache.lock(foreign)
    node = cache.match_prefix([1, 2]).node
    cache.evict(10)
    with pytest.raises(ValueError, match="evicted"):
        cache.lock(node)
    with pytest.raises(ValueError, match="TreeNode"):
        cache.lock("node")
    cache.check_integrity()


def test_double_release_into_cache_is_rejected():
    alloc, cache = make(page_size=1)
    t = PageTable(alloc, 1)
    t.reserve(3, nocopy)
    t.commit(3)
    pages = t.detach()
    cache.release_into_cache([1, 2, 3], pages)
    with pytest.raises(ValueError, match="released twice"):
        cache.release_into_cache([1, 2, 3], pages)
    assert [alloc.refcount(p) for p in pages] == [1, 1, 1]
    cache.check_integrity()
    alloc.check_integrity()


def test_insert_rejects_pages_the_tree_already_owns_or_free_pages():
    alloc, cache = make(page_size=1)
    pages = cache_request(cache, [1, 2])
    with pytest.raises(ValueError, match="already owned"):
        cache.insert([7, 8], pages)
    free_page = alloc.num_pages - 1
    with pytest.raises(ValueError, match="not an allocated page"):
        cache.insert([9], [free_page])
    with pytest.raises(ValueError, match="cannot hold"):
        cache.insert([9, 9, 9], [free_page])
    cache.check_integrity()
    assert cache.cached_pages == 2


def test_double_free_of_pages():
    alloc, cache = make()
    t = PageTable(alloc, 1)
    t.reserve(2, nocopy)
    t.commit(2)
    pages = list(t.pages)
    t.free()
    with pytest.raises(ValueError, match="already freed"):
        t.free()
    with pytest.raises(PageRefError, match="freed twice"):
        alloc.decref(pages)
    alloc.check_integrity()
    cache.check_integrity()
    assert alloc.num_free == alloc.num_pages


def test_evict_bad_argument():
    alloc, cache = make()
    with pytest.raises(ValueError, match="num_pages"):
        cache.evict(-1)


# ---- the LRU queue against a brute-force oracle ---------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_each_eviction_takes_the_least_recently_used_unlocked_leaf(seed):
    rng = random.Random(seed)
    alloc, cache = make(page_size=2, num_pages=2000)
    locked = []
    for _ in range(800):
        op = rng.random()
        key = [rng.randrange(3) for _ in range(rng.randrange(1, 14))]
        if op < 0.35 and alloc.num_free >= 7:
            cache_request(cache, key, namespace=rng.choice(["a", "b"]))
        elif op < 0.55:
            cache.match_prefix(key, rng.choice(["a", "b"]))
        elif op < 0.65:
            node = cache.match_prefix(key, rng.choice(["a", "b"])).node
            cache.lock(node)
            locked.append(node)
        elif op < 0.75 and locked:
            cache.unlock(locked.pop(rng.randrange(len(locked))))
        else:
            leaves = [n for r in cache.roots().values() for n in subtree(r) if n.evictable]
            if leaves:
                oldest = min(leaves, key=lambda n: n.last_access)
                assert cache.evict(1) >= 1
                assert [n for n in leaves if not n.alive] == [oldest]
        cache.check_integrity()
    for node in locked:
        cache.unlock(node)
    cache.flush()
    assert alloc.num_free == alloc.num_pages


def test_token_keys_are_checked_once():
    _, cache = make()
    key = TokenKey.check([1, 2, 3], "test")
    assert TokenKey.check(key, "test") is key and TokenKey.trusted([1, 2]) == (1, 2)
    cache_request(cache, [1, 2, 3])
    assert cache.match_prefix(key).length == 3
    with pytest.raises(ValueError, match="test: tokens must be non-negative ints"):
        TokenKey.check([1, -2], "test")


def test_a_demoted_history_goes_before_every_live_leaf_until_touched():
    """``demote``: the history's own nodes (below the branch point, past ``keep`` tokens) are
    evicted first, in their old LRU order among themselves; a match makes them live again."""
    alloc, cache = make(page_size=2)
    shared = [1, 2, 3, 4]
    a, b, c = shared + [10, 11, 12, 13], shared + [20, 21, 22, 23], [30, 31, 32, 33]
    for toks in (a, b, c):                     # a is the least recently used
        cache_request(cache, toks)
    node_b = cache.match_prefix(b, record=False).node
    assert cache.demote(node_b, keep=len(shared)) == 2      # b's own 4 tokens, not the shared
    cache.check_integrity()
    cache.evict(1)
    assert cache.match_prefix(b, record=False).length == 4  # b's own part went first
    assert cache.match_prefix(a, record=False).length == 8  # a (older, live) stayed
    # keep covers the whole history: nothing demoted; a node with children: nothing either
    node_a = cache.match_prefix(a, record=False).node
    assert cache.demote(node_a, keep=8) == 0
    parent = cache.match_prefix(shared, record=False).node
    assert cache.demote(parent) == 0
    # demoted, then touched: live again (c demoted, then matched: a is evicted before it)
    node_c = cache.match_prefix(c, record=False).node
    assert cache.demote(node_c) == 2 and cache.demote(node_c) == 0     # once
    cache.match_prefix(c)
    cache.evict(1)
    assert cache.match_prefix(c, record=False).length == 4
    assert cache.match_prefix(a, record=False).length == 4  # a's own part: the LRU live leaf
    cache.check_integrity()
    with pytest.raises(ValueError, match="demote"):
        cache.demote("not a node")
