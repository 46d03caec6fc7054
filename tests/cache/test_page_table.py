"""Page tables: reserve/commit, copy-on-write forks on real KV tensors, KV-usage accounting."""

import pytest
import torch

from agentlang.runtime.attention.torch_backend import TorchAttentionBackend
from agentlang.runtime.attention.forward_batch import build_forward_batch
from agentlang.runtime.cache.kv_pool import KVLayout, KVPool
from agentlang.runtime.cache.page_allocator import OutOfPagesError, PageAllocator
from agentlang.runtime.cache.page_table import PageTable, PageTableStats, kv_usage, memory_metrics
from agentlang.runtime.cache.radix_cache import RadixCache

LAYOUT = KVLayout(num_layers=3, num_kv_heads=2, head_dim=4, dtype=torch.float32)


def nocopy(src, dst):
    pass


class KVWorld:
    """A pool, a backend and helpers to write/read a sequence's K/V through its page table."""

    def __init__(self, page_size, num_pages=32):
        self.pool = KVPool(LAYOUT, page_size, num_pages=num_pages)
        self.alloc = PageAllocator(num_pages)
        self.backend = TorchAttentionBackend()
        self.stats = PageTableStats()

    def copy(self, src, dst):
        self.backend.copy_pages(self.pool, src, dst)

    def table(self):
        return PageTable(self.alloc, self.pool.page_size, self.stats)

    def append(self, t: PageTable, values: list[float]):
        """Append tokens whose K (V) is filled with value (-value) in every layer."""
        t.reserve(len(values), self.copy)
        batch = build_forward_batch([[0] * len(values)], [t.num_tokens], [t.pages],
                                    self.pool.page_size)
        H, D = LAYOUT.num_kv_heads, LAYOUT.head_dim
        k = torch.tensor(values).view(-1, 1, 1).expand(-1, H, D).contiguous()
        for layer in range(LAYOUT.num_layers):
            self.backend.store_kv(self.pool, layer, k + layer, -(k + layer), batch)
        t.commit(len(values))

    def read(self, t: PageTable) -> list[list[float]]:
        """Per layer, the K value of each token (checking V and all heads/dims agree)."""
        S = self.pool.page_size
        out = []
        for layer in range(LAYOUT.num_layers):
            slots = [t.pages[i // S] * S + i % S for i in range(t.num_tokens)]
            k = self.pool.k_cache(layer).view(-1, LAYOUT.num_kv_heads, LAYOUT.head_dim)[slots]
            v = self.pool.v_cache(layer).view(-1, LAYOUT.num_kv_heads, LAYOUT.head_dim)[slots]
            assert torch.equal(v, -k)
            assert torch.equal(k, k[:, :1, :1].expand_as(k))
            out.append([x - layer for x in k[:, 0, 0].tolist()])
        return out


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_cow_children_never_touch_parent_or_sibling(page_size):
    w = KVWorld(page_size)
    parent = w.table()
    prefix = [float(i + 1) for i in range(page_size * 2 + page_size // 2 + 1)]  # partial last page
    w.append(parent, prefix)
    a, b = parent.fork(2)
    assert a.pages == b.pages == parent.pages
    w.append(a, [100.0, 101.0])
    w.append(b, [200.0])
    w.append(a, [102.0])
    w.append(parent, [300.0, 301.0, 302.0])
    assert w.read(parent) == [prefix + [300.0, 301.0, 302.0]] * LAYOUT.num_layers
    assert w.read(a) == [prefix + [100.0, 101.0, 102.0]] * LAYOUT.num_layers
    assert w.read(b) == [prefix + [200.0]] * LAYOUT.num_layers
    full = len(prefix) // page_size
    # Full pages stay shared by all three; the partial page got copied by two of them.
    assert a.pages[:full] == b.pages[:full] == parent.pages[:full]
    assert all(w.alloc.refcount(p) == 3 for p in parent.pages[:full])
    if len(prefix) % page_size:
        assert len({a.pages[full], b.pages[full], parent.pages[full]}) == 3
        assert w.stats.cow_copies == 2   # the last writer owned the page alone: no copy
    else:
        assert w.stats.cow_copies == 0
    for t in (parent, a, b):
        t.free()
    w.alloc.check_integrity()
    assert w.alloc.num_free == w.alloc.num_pages


def test_cow_copies_every_layer():
    w = KVWorld(page_size=4)
    parent = w.table()
    w.append(parent, [1.0, 2.0])
    (child,) = parent.fork(1)
    old = parent.pages[0]
    w.append(child, [3.0])
    assert child.pages[0] != old and parent.pages[0] == old
    assert torch.equal(w.pool.buffer[:, :, child.pages[0], :2], w.pool.buffer[:, :, old, :2])
    assert w.alloc.refcount(old) == 1 and w.stats.cow_copies == 1


def test_reserve_is_atomic_when_out_of_pages():
    alloc = PageAllocator(4)
    t = PageTable(alloc, 4)
    t.reserve(6, nocopy)
    t.commit(6)
    (child,) = t.fork(1)
    alloc.allocate(alloc.num_free)            # exhaust the pool
    before = (list(child.pages), child.num_tokens, [alloc.refcount(p) for p in child.pages])
    calls = []
    with pytest.raises(OutOfPagesError):
        child.reserve(1, lambda s, d: calls.append((s, d)))   # needs a COW copy
    assert calls == []
    assert (list(child.pages), child.num_tokens,
            [alloc.refcount(p) for p in child.pages]) == before
    alloc.check_integrity()


def test_reserve_rolls_back_when_copy_fails():
    alloc = PageAllocator(8)
    t = PageTable(alloc, 4)
    t.reserve(2, nocopy)
    t.commit(2)
    (child,) = t.fork(1)

    def boom(src, dst):
        raise RuntimeError("copy failed")

    with pytest.raises(RuntimeError, match="copy failed"):
        child.reserve(3, boom)
    assert child.pages == t.pages and alloc.num_used == 1 and alloc.refcount(t.pages[0]) == 2
    alloc.check_integrity()


def test_commit_keeps_exactly_ceil_pages():
    alloc = PageAllocator(16)
    t = PageTable(alloc, 4)
    new = t.reserve(9, nocopy)
    assert len(new) == 3 and t.capacity == 12
    t.commit(5)                                  # a chunk ended early: spare page released
    assert len(t.pages) == 2 and alloc.num_used == 2
    t.reserve(3, nocopy)
    t.commit(3)
    assert len(t.pages) == 2 and t.num_tokens == 8
    with pytest.raises(ValueError, match="cannot commit"):
        t.commit(1)
    t.reserve(1, nocopy)
    t.commit(1)
    assert len(t.pages) == 3


def test_adopt_prefix_and_detach():
    alloc = PageAllocator(8)
    pages = alloc.allocate(2)
    t = PageTable(alloc, 4)
    with pytest.raises(ValueError, match="do not hold exactly"):
        t.adopt_prefix(pages, 9)
    t.adopt_prefix(pages, 7)                     # partial last page, e.g. recompute 1 token
    assert [alloc.refcount(p) for p in pages] == [2, 2]
    with pytest.raises(ValueError, match="not empty"):
        t.adopt_prefix(pages, 8)
    t.reserve(1, nocopy)                         # position 7 lives in a shared page: copied
    assert t.pages[1] != pages[1] and alloc.refcount(pages[1]) == 1
    t.commit(1)
    got = t.detach()
    with pytest.raises(ValueError, match="already freed or detached"):
        t.reserve(1, nocopy)
    alloc.decref(got)
    alloc.decref(pages)
    assert alloc.num_free == alloc.num_pages


def test_kv_usage_counts_shared_pages_once():
    alloc = PageAllocator(16)
    stats = PageTableStats()
    t = PageTable(alloc, 4, stats)
    t.reserve(6, nocopy)
    t.commit(6)
    a, b = t.fork(2)
    a.reserve(1, nocopy)
    a.commit(1)
    u = kv_usage(alloc, 4, [t, a, b], stats=stats)
    # pages: full page (4) + parent/b's partial page (2) + a's copy (3)
    assert u.allocated_slots == 12 and u.stored_tokens == 9 and u.cow_copies == 1
    assert u.waste_pct == pytest.approx(25.0)


def test_memory_metrics_combines_cache_and_tables():
    alloc = PageAllocator(16)
    cache = RadixCache(alloc, 4)
    stats = PageTableStats()
    done = PageTable(alloc, 4, stats)
    done.reserve(9, nocopy)
    done.commit(9)
    cache.release_into_cache(list(range(9)), done.detach())   # 2 pages cached, partial freed
    m = cache.match_prefix(list(range(8)) + [7, 7])
    t = PageTable(alloc, 4, stats)
    t.adopt_prefix(m.pages, 7)                                  # recompute token 7: COW
    cache.lock(m.node)
    t.reserve(3, nocopy)
    t.commit(3)
    got = memory_metrics(cache, [t], stats)
    assert got["cow_copies"] == 1 and got["cached_pages"] == 2
    assert got["pages_used"] == 4 and got["protected_pages"] == 2
    # pages: tree page 0 (4, shared), tree page 1 (4), t's copy of page 1 (4), t's page 2 (2)
    assert got["kv_allocated_slots"] == 16 and got["kv_stored_tokens"] == 14
    assert got["kv_waste_pct"] == pytest.approx(12.5)
    assert got["prefix_hit_tokens"] == 8 and got["prefix_queried_tokens"] == 10
