"""Sliding-window KV pages (``cache/window_pages.py``) and the page table's pins: a window
page lives while its global page does, is pinned while some running table's window reaches
it, idles (evictable, least recently idle first) otherwise; a cached prefix is usable only
up to where its last window is resident; the pool reads and writes the sliding layers through
the map and copies them on copy-on-write."""

import pytest
import torch

from agentlang.runtime.cache.kv_pool import KVLayout, KVPool, split_budget
from agentlang.runtime.cache.page_allocator import PageAllocator
from agentlang.runtime.cache.page_table import PageTable
from agentlang.runtime.cache.window_pages import (OutOfWindowPagesError, WindowPageError,
                                                  WindowPages, window_pool_pages)

S, W = 4, 8          # page size, window: a query sees its last 8 keys = 2 to 3 pages


def tables(num_pages=16, window_pages=8):
    w = WindowPages(num_pages, window_pages, S, W)
    return w, PageAllocator(num_pages, w)


def no_copy(src, dst):
    raise AssertionError("no copy expected")


def grow(t: PageTable, n: int, copy=no_copy) -> None:
    t.reserve(n, copy)
    t.commit(n)


def test_a_table_pins_only_the_window_of_its_next_token():
    w, alloc = tables()
    t = PageTable(alloc, S)
    grow(t, 20)                                  # pages 0..4, all attached in one step
    assert w.metrics()["window_pages_pinned"] == 5
    grow(t, 1)                                   # next token 21 sees 13..20: pages 3..5
    assert t.pin_lo == 3 and w.metrics()["window_pages_pinned"] == 3
    assert w.num_idle == 3                       # pages 0..2 stay resident, idle
    w.check_integrity()
    t.free()
    assert w.num_idle == 0 and w.num_free == 8   # freed global pages take theirs along
    alloc.check_integrity()
    w.check_integrity()


def test_idle_pages_are_evicted_least_recent_first_and_pinned_ones_never():
    w, alloc = tables(num_pages=32, window_pages=8)
    a = PageTable(alloc, S)
    grow(a, 20)
    grow(a, 1)                                   # a: pages 0..2 idle, 3..5 pinned
    b = PageTable(alloc, S)
    grow(b, 8)                                   # 2 free pages left: the rest from idle
    assert w.evictions == 0
    grow(b, 4)                                   # one more page: evicts a's page 0 first
    assert w.evictions == 1 and not w.resident(a.pages[0]) and w.resident(a.pages[1])
    with pytest.raises(OutOfWindowPagesError):   # all 8 pinned or idle; asking for 9 fails
        PageTable(alloc, S).reserve(40, no_copy)
    w.check_integrity()
    alloc.check_integrity()                      # the failed reserve kept no global page


def test_usable_prefix_stops_where_the_window_was_evicted():
    w, alloc = tables(num_pages=32, window_pages=12)
    a = PageTable(alloc, S)
    grow(a, 32)
    grow(a, 1)                                   # pages 0..8; 0..5 idle, 6..8 pinned
    pages = list(a.pages[:8])
    assert PageTable.usable_prefix(alloc, pages, 32) == 32
    c = PageTable(alloc, S)
    c.adopt_prefix(pages[:4], 16)                # its next token sees 9..16: pins pages 2, 3
    assert c.pin_lo == 2
    a.detach()                                   # a's pins go; the test keeps its references
    b = PageTable(alloc, S)
    grow(b, 36)                                  # 9 pages: 3 free + 6 idle evicted, oldest first
    assert w.evictions == 6
    assert [w.resident(p) for p in pages] == [False, False, True, True] + [False] * 4
    # M = 32 needs pages 6, 7; 28 needs 5, 6; 24 needs 4, 5; 20 needs 3, 4; 16 needs 2, 3
    assert PageTable.usable_prefix(alloc, pages, 32) == 16
    assert PageTable.usable_prefix(alloc, pages, 12) == 0    # 12 needs pages 1, 2; 4 needs 0
    with pytest.raises(WindowPageError):
        PageTable(alloc, S).adopt_prefix(pages, 32)
    d = PageTable(alloc, S)
    d.adopt_prefix(pages[:4], 16)                # what the scheduler adopts after the cut
    w.check_integrity()
    alloc.check_integrity()


def test_fork_shares_pins_and_copy_on_write_copies_the_sliding_layers():
    layout = KVLayout(3, 1, 2, torch.float32, layer_windows=(W, 0, W))
    pool = KVPool(layout, S, num_pages=16, max_batch_tokens=8)
    w = pool.windows
    assert w.num_window_pages < pool.num_pages            # fewer pages for the sliding layers
    alloc = PageAllocator(pool.num_pages, w)
    t = PageTable(alloc, S)
    t.reserve(6, pool.copy_pages)
    slots = torch.tensor([t.pages[i // S] * S + i % S for i in range(6)])
    k = torch.arange(6 * 2, dtype=torch.float32).view(6, 1, 2)
    for layer in range(3):
        pool.store(layer, slots, k + layer, -k)
    t.commit(6)
    a, b = t.fork(2)
    a.reserve(1, pool.copy_pages)                         # the shared partial page is copied
    assert a.pages[1] != t.pages[1]
    for layer in range(3):                                # every layer's tokens 4, 5 came along
        got = pool.gather(layer, 0, torch.tensor([a.pages[1]]))[0, :2]
        assert torch.equal(got, (k + layer)[4:6])
    for x in (a, b, t):
        x.free()
    assert alloc.num_free == pool.num_pages and w.num_free == w.num_window_pages
    w.check_integrity()


def test_sliding_layers_hold_fewer_bytes_and_the_budget_split_fits():
    """Gemma 3 270M's pattern (a global layer every 6), its 512-key window."""
    full = KVLayout(18, 1, 64, torch.float32)
    win = KVLayout(18, 1, 64, torch.float32, layer_windows=tuple(0 if i % 6 == 5 else 512
                                                                 for i in range(18)))
    budget = 128 * 2**20
    p_full = KVPool(full, 16, budget_mb=128).num_pages
    pages, wp = split_budget(win, 16, budget, 2048, None)
    pool = KVPool(win, 16, budget_mb=128)
    assert (pool.num_pages, pool.windows.num_window_pages) == (pages, wp)
    assert pool.nbytes() <= budget and pages > 2.5 * p_full     # 3 of 18 layers full-length
    assert wp == window_pool_pages(pages, 16, 512, 2048) < pages
    # a budget too small for the step's floor: one window page a global page, never worse
    assert split_budget(win, 16, 16 * 2**20, 2048, None) == (KVPool(full, 16, budget_mb=16)
                                                             .num_pages,) * 2
    with pytest.raises(ValueError, match="window_kv_fraction"):
        KVPool(win, 16, budget_mb=64, window_fraction=0.0)
    with pytest.raises(ValueError, match="one window size"):
        KVLayout(2, 1, 2, torch.float32, layer_windows=(4, 8))


def test_the_planner_knows_the_window():
    """Gemma 3 270M's config: an 8k request keeps 3 layers whole and 15 for the window."""
    from agentlang.runtime.models.kv_plan import plan

    cfg = {"architectures": ["Gemma3ForCausalLM"], "hidden_size": 640, "num_hidden_layers": 18,
           "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
           "intermediate_size": 2048, "vocab_size": 262144, "sliding_window": 512,
           "sliding_window_pattern": 6, "max_position_embeddings": 32768}
    p = plan(cfg, context=8192, memory_gb=4, model_dtype="bfloat16", num_parameters=268_000_000)
    per_token = 2 * 256 * 2                                  # K and V of one layer, bf16
    assert (p.window, p.window_layers) == (512, 15)
    assert p.bytes_per_request_full_length == 8192 * 18 * per_token
    assert p.bytes_per_request == 8192 * 3 * per_token + (32 + 2) * 16 * 15 * per_token
    assert p.max_concurrent_requests == p.kv_budget_bytes // p.bytes_per_request
    assert p.window_kv_fraction == 34 / 512
    assert "sliding window  512 tokens in 15 of 18 layers" in p.format()
    no_window = plan({**cfg, "architectures": ["LlamaForCausalLM"]}, context=8192, memory_gb=4,
                     model_dtype="bfloat16", num_parameters=268_000_000)
    assert no_window.window == 0 and no_window.bytes_per_request == p.bytes_per_request_full_length


def test_a_session_hold_pins_its_history_last_window():
    """A held turn keeps its history's last window resident through window pressure (the
    continuation's hit stays whole); released, those pages idle and can go."""
    from agentlang.runtime.cache.radix_cache import RadixCache, TokenKey
    from agentlang.runtime.cache.retention import Retention

    w, alloc = tables(num_pages=32, window_pages=11)
    cache = RadixCache(alloc, S)
    ret = Retention(cache, 32)
    tokens = TokenKey.check(list(range(100, 124)), "test")      # 6 pages
    t = PageTable(alloc, S)
    grow(t, 24)
    pages = list(t.pages)
    cache.release_into_cache(tokens, t.detach(), ())
    node = cache.match_prefix(tokens, (), record=False).node
    assert ret.hold("agent", node, now=0.0, ttl=60.0)
    assert w.metrics()["window_pages_pinned"] == 2          # positions 17..23: pages 4, 5
    other = PageTable(alloc, S)
    grow(other, 36)                  # 9 pages: 5 free + the 4 idle ones (unheld: page 4 too)
    assert PageTable.usable_prefix(alloc, pages, 24) == 24
    ret.release("agent", "closed")
    assert w.num_idle == 2
    other.free()
    w.check_integrity()
