"""Stateful property test of the prefix cache + copy-on-write page tables.

Random interleavings of request start (match + adopt + prefill), append (with COW), fork,
finish (release into the cache), abort, lock/unlock, evict and flush, at page sizes 1, 4, 16.
After every step:
* the tree and the allocator pass their integrity checks;
* every page's refcount is exactly (#live tables holding it) + (1 if the tree owns it);
* a shadow of the KV pool (each slot holds a hash of the whole prefix up to its token) matches
  what every live request and every tree path expect to read: no write ever lands in a page
  someone else can see, and the cache only returns pages holding the right prefix.
At the end everything is freed and every page is back in the allocator.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule,
)

from agentlang.runtime.cache.page_allocator import OutOfPagesError, PageAllocator
from agentlang.runtime.cache.page_table import PageTable
from agentlang.runtime.cache.radix_cache import RadixCache, TreeNode

NAMESPACES = [("m", "bf16", None), ("m", "int8", None)]


def prefix_hashes(tokens) -> list[int]:
    out, h = [], 17
    for t in tokens:
        h = hash((h, t))
        out.append(h)
    return out


@dataclass
class Req:
    table: PageTable
    tokens: list[int]           # tokens whose K/V the table holds (len == table.num_tokens)
    node: TreeNode | None       # locked cache node, or None
    ns: tuple


def make_machine(page_size: int, num_pages: int):
    ps = page_size
    bases = [[i % 3] * (2 * ps + 1) + [1] * ps for i in range(3)] + [list(range(3 * ps + 2))]
    tails = st.lists(st.integers(0, 2), max_size=ps + 2)
    cuts = st.one_of(st.sampled_from([ps, 2 * ps, 2 * ps + 1, 3 * ps]), st.integers(0, 3 * ps + 2))
    keys = st.builds(lambda b, cut, tail: (b[:cut] + tail) or [0],
                     st.sampled_from(bases), cuts, tails)

    class CacheMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.alloc = PageAllocator(num_pages)
            self.cache = RadixCache(self.alloc, ps)
            self.kv: list[int | None] = [None] * (num_pages * ps)   # shadow of the pool
            self.reqs: list[Req] = []
            self.held: list[TreeNode] = []

        # ---- helpers ---------------------------------------------------------------------
        def copy(self, src, dst):
            for s, d in zip(src, dst):
                self.kv[d * ps:(d + 1) * ps] = self.kv[s * ps:(s + 1) * ps]

        def write(self, req: Req, new_tokens: list[int]) -> bool:
            """Reserve (evicting on pressure), write and commit; False if out of pages."""
            t = req.table
            try:
                t.reserve(len(new_tokens), self.copy)
            except OutOfPagesError:
                self.cache.evict(len(new_tokens) // ps + 2)
                try:
                    t.reserve(len(new_tokens), self.copy)
                except OutOfPagesError:
                    return False
            hashes = prefix_hashes(req.tokens + new_tokens)
            for i in range(t.num_tokens, t.num_tokens + len(new_tokens)):
                page = t.pages[i // ps]
                assert self.alloc.refcount(page) == 1, "write into a page someone else holds"
                self.kv[page * ps + i % ps] = hashes[i]
            t.commit(len(new_tokens))
            req.tokens += new_tokens
            return True

        def drop(self, req: Req, into_cache: bool):
            self.reqs.remove(req)
            if into_cache and req.tokens:
                self.cache.release_into_cache(req.tokens, req.table.detach(), req.ns)
            else:
                req.table.free()
            if req.node is not None:
                self.cache.unlock(req.node)

        @initialize(which=st.lists(st.integers(0, len(bases) - 1), max_size=3))
        def seed_cache(self, which):
            for b in which:
                self.run_to_completion(bases[b], NAMESPACES[0])

        # ---- rules -----------------------------------------------------------------------
        @rule(tokens=keys, ns=st.sampled_from(NAMESPACES), recompute_last=st.booleans())
        def start(self, tokens, ns, recompute_last):
            m = self.cache.match_prefix(tokens, ns)
            assert m.length % ps == 0 and len(m.pages) * ps == m.length
            assert self.kv_of(m.pages, m.length) == prefix_hashes(tokens[:m.length])
            self.cache.lock(m.node)
            n = m.length - 1 if recompute_last and m.length else m.length
            req = Req(PageTable(self.alloc, ps), [], m.node, ns)
            req.table.adopt_prefix(m.pages[:-(-n // ps)], n)
            req.tokens = list(tokens[:n])
            self.reqs.append(req)
            if not self.write(req, list(tokens[n:])):
                self.drop(req, into_cache=False)

        @precondition(lambda self: self.reqs)
        @rule(i=st.integers(0, 10**6), tokens=tails)
        def append(self, i, tokens):
            req = self.reqs[i % len(self.reqs)]
            if tokens and not self.write(req, tokens):
                self.drop(req, into_cache=False)

        @precondition(lambda self: self.reqs and len(self.reqs) < 12)
        @rule(i=st.integers(0, 10**6), n=st.integers(1, 3))
        def fork(self, i, n):
            req = self.reqs[i % len(self.reqs)]
            for child in req.table.fork(n):
                if req.node is not None:
                    self.cache.lock(req.node)
                self.reqs.append(Req(child, list(req.tokens), req.node, req.ns))

        @precondition(lambda self: self.reqs)
        @rule(i=st.integers(0, 10**6))
        def finish(self, i):
            self.drop(self.reqs[i % len(self.reqs)], into_cache=True)

        @precondition(lambda self: self.reqs)
        @rule(i=st.integers(0, 10**6))
        def abort(self, i):
            self.drop(self.reqs[i % len(self.reqs)], into_cache=False)

        @rule(tokens=keys, ns=st.sampled_from(NAMESPACES))
        def run_to_completion(self, tokens, ns):
            self.start(tokens, ns, recompute_last=True)
            if self.reqs and self.reqs[-1].tokens == tokens:
                self.drop(self.reqs[-1], into_cache=True)

        @rule(n=st.integers(0, 2 * num_pages // 3))
        def evict(self, n):
            before = self.alloc.num_free
            freed = self.cache.evict(n)
            assert self.alloc.num_free == before + freed
            assert freed >= n or self.cache.evictable_pages == 0

        @rule(tokens=keys, ns=st.sampled_from(NAMESPACES))
        def lock_prefix(self, tokens, ns):
            m = self.cache.match_prefix(tokens, ns, record=False)
            self.cache.lock(m.node)
            self.held.append(m.node)

        @precondition(lambda self: self.held)
        @rule(i=st.integers(0, 10**6))
        def unlock_prefix(self, i):
            self.cache.unlock(self.held.pop(i % len(self.held)))

        @rule(tokens=keys)
        def unlock_unlocked_is_rejected(self, tokens):
            m = self.cache.match_prefix(tokens, ("other-ns",), record=False)
            if m.node.lock_ref == 0:
                with pytest.raises(ValueError, match="not locked"):
                    self.cache.unlock(m.node)

        @precondition(lambda self: self.reqs)
        @rule(i=st.integers(0, 10**6))
        def double_free_is_rejected(self, i):
            req = self.reqs[i % len(self.reqs)]
            self.drop(req, into_cache=False)
            with pytest.raises(ValueError, match="already freed"):
                req.table.free()

        @rule(tokens=keys, ns=st.sampled_from(NAMESPACES), keep=st.integers(0, 12))
        def demote(self, tokens, ns, keep):
            m = self.cache.match_prefix(tokens, ns, record=False)
            if m.node.parent is not None:
                self.cache.demote(m.node, keep)

        @rule()
        def flush(self):
            self.cache.flush()
            assert self.cache.evictable_pages == 0

        # ---- invariants ------------------------------------------------------------------
        def kv_of(self, pages, n):
            return [self.kv[pages[i // ps] * ps + i % ps] for i in range(n)]

        @invariant()
        def consistent(self):
            self.cache.check_integrity()
            self.alloc.check_integrity()
            expected = [0] * num_pages
            for req in self.reqs:
                assert req.table.num_tokens == len(req.tokens)
                assert len(req.table.pages) == -(-len(req.tokens) // ps)
                for p in req.table.pages:
                    expected[p] += 1
                assert self.kv_of(req.table.pages, len(req.tokens)) == prefix_hashes(req.tokens)
            for p in self.cache.owned_pages():
                expected[p] += 1
            assert expected == [self.alloc.refcount(p) for p in range(num_pages)]
            for root in self.cache._roots.values():
                stack = [(root, [])]
                while stack:
                    node, path = stack.pop()
                    for c in node.children.values():
                        toks = path + list(c.key)
                        got = self.kv_of(c.pages, len(c.key))
                        assert got == prefix_hashes(toks)[len(path):]
                        stack.append((c, toks))

        def teardown(self):
            for req in list(self.reqs):
                self.drop(req, into_cache=False)
            for node in self.held:
                self.cache.unlock(node)
            self.cache.flush()
            self.cache.check_integrity()
            assert self.cache.cached_pages == 0 and self.cache.protected_pages == 0
            assert self.alloc.num_free == num_pages

    return CacheMachine


SETTINGS = settings(max_examples=60, stateful_step_count=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

TestCachePageSize1 = make_machine(page_size=1, num_pages=64).TestCase
TestCachePageSize1.settings = SETTINGS
TestCachePageSize4 = make_machine(page_size=4, num_pages=40).TestCase
TestCachePageSize4.settings = SETTINGS
TestCachePageSize16 = make_machine(page_size=16, num_pages=24).TestCase
TestCachePageSize16.settings = SETTINGS
