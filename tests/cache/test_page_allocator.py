"""PageAllocator: distinct pages, refcounts, exhaustion, misuse."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.cache.page_allocator import OutOfPagesError, PageAllocator, PageRefError

import torch


def test_pages_are_never_double_allocated_and_come_back():
    a = PageAllocator(10)
    first = a.allocate(6)
    second = a.allocate(4)
    assert len(set(first + second)) == 10 and a.num_free == 0
    a.decref(first)
    assert a.num_free == 6
    again = a.allocate(6)
    assert set(again) == set(first) and not set(again) & set(second)
    a.check_integrity()


def test_exhaustion_raises_clearly_and_changes_nothing():
    a = PageAllocator(4)
    held = a.allocate(3)
    with pytest.raises(OutOfPagesError, match="asked for 2, 1 free of 4"):
        a.allocate(2)
    assert a.num_free == 1 and [a.refcount(p) for p in held] == [1, 1, 1]
    a.check_integrity()
    assert len(a.allocate(1)) == 1


def test_refcounts_share_and_release():
    a = PageAllocator(3)
    (p,) = a.allocate(1)
    a.incref([p])
    assert a.is_shared(p) and a.decref([p]) == [] and a.refcount(p) == 1
    assert a.decref([p]) == [p] and a.num_free == 3


@pytest.mark.parametrize("op, pages", [("decref", [0]), ("incref", [0]), ("decref", [99]),
                                       ("decref", [-1]), ("decref", ["x"])])
def test_misuse_is_a_clear_error_and_the_pool_stays_consistent(op, pages):
    a = PageAllocator(4)
    with pytest.raises(PageRefError):
        getattr(a, op)(pages)
    a.check_integrity()
    assert a.num_free == 4


def test_double_free_in_one_call_is_refused_atomically():
    a = PageAllocator(4)
    (p,) = a.allocate(1)
    with pytest.raises(PageRefError, match="freed twice"):
        a.decref([p, p])
    assert a.refcount(p) == 1
    a.check_integrity()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5)), max_size=60))
def test_random_allocate_free_sequences_keep_integrity(ops):
    a = PageAllocator(16)
    held: list[int] = []
    for alloc, n in ops:
        if alloc:
            try:
                held += a.allocate(n)
            except OutOfPagesError:
                assert n > a.num_free
        elif held:
            a.decref(held[:n])
            held = held[n:]
        a.check_integrity()
        assert len(held) == len(set(held)) == a.num_used
    a.decref(held)
    assert a.num_free == 16


def test_pool_is_sized_from_a_budget_and_every_page_size_works():
    layout = KVLayout(num_layers=2, num_kv_heads=3, head_dim=64, dtype=torch.float32)
    for ps in (1, 16, 32):
        pool = KVPool(layout, ps, budget_mb=1)
        assert pool.num_pages == 2**20 // (layout.bytes_per_token() * ps)
        assert pool.k_cache(1).shape == (pool.num_pages, ps, 3, 64)
    with pytest.raises(ValueError, match="too small"):
        KVPool(layout, 32, budget_mb=0.001)
