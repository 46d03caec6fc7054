"""The dashboard's building blocks without a server: page states against a brute-force oracle,
the bounded tree snapshot (hottest first, cold subtrees counted), program graphs, and the
static files shipped as package data."""

from __future__ import annotations

import fnmatch
import random
from pathlib import Path

import pytest

from agentlang.runtime.cache.snapshot import snapshot_tree
from agentlang.runtime.cache.page_allocator import PageAllocator, page_states
from agentlang.runtime.cache.page_table import PageTable
from agentlang.runtime.cache.radix_cache import RadixCache
from agentlang.runtime.server.errors import APIError
from agentlang.runtime.server.ops.programs import ProgramTracker, parse_tag

ROOT = Path(__file__).resolve().parents[2]


def _random_state(seed: int):
    rnd = random.Random(seed)
    alloc = PageAllocator(64)
    cache = RadixCache(alloc, page_size=2)
    tables = []
    for _ in range(12):
        key = [rnd.randrange(3) for _ in range(rnd.randrange(2, 12))]
        m = cache.match_prefix(key)
        t = PageTable(alloc, 2)
        t.adopt_prefix(m.pages, m.length)
        t.reserve(len(key) - m.length, lambda s, d: None)
        t.commit(len(key) - m.length)
        if rnd.random() < 0.5:
            cache.release_into_cache(key, t.detach())
        else:
            tables.append(t)
            if rnd.random() < 0.5 and t.pages:
                tables.extend(t.fork(2))
    return alloc, cache


@pytest.mark.parametrize("seed", range(6))
def test_page_states_match_brute_force(seed):
    alloc, cache = _random_state(seed)
    rc, owned = alloc.refcounts(), cache.owned_pages()
    s = page_states(rc, owned)
    want = ["0" if r == 0 else "3" if r > 1 else "1" if p in owned else "2"
            for p, r in enumerate(rc)]
    assert s.codes.decode() == "".join(want)
    assert (s.free, s.cache_only, s.private, s.shared) == tuple(want.count(c) for c in "0123")
    assert s.free == alloc.num_free and sum(s[:4]) == alloc.num_pages



def test_page_states_cover_every_state():
    states = [page_states(*(lambda a, c: (a.refcounts(), c.owned_pages()))(*_random_state(s)))
              for s in range(6)]
    assert all(sum(getattr(s, k) for s in states) > 0
               for k in ("free", "cache_only", "private", "shared"))


def _tree(n_keys: int, seed: int = 1) -> RadixCache:
    rnd = random.Random(seed)
    cache = RadixCache(PageAllocator(4000), page_size=1)
    for _ in range(n_keys):
        key = [rnd.randrange(4) for _ in range(rnd.randrange(2, 9))]
        cache.match_prefix(key)
        cache.release_into_cache(key, cache.allocator.allocate(len(key)))
    return cache


def test_tree_snapshot_complete_when_small():
    cache = _tree(60)
    snap = snapshot_tree(cache, 10_000)
    assert not snap.truncated and snap.shown_pages == snap.cached_pages == cache.cached_pages
    ids = {r.id for r in snap.rows}
    seen = set()
    for r in snap.rows:                       # parents first, depths consistent
        assert r.parent == 0 or r.parent in seen
        seen.add(r.id)
        assert r.tokens == r.pages and r.hidden_children == 0
    assert len(ids) == len(snap.rows)


@pytest.mark.parametrize("limit", [1, 5, 20])
def test_tree_snapshot_bounded_keeps_hottest_and_counts_the_rest(limit):
    cache = _tree(80)
    full = snapshot_tree(cache, 10_000)
    snap = snapshot_tree(cache, limit)
    assert len(snap.rows) == limit and snap.truncated
    shown = {r.id for r in snap.rows}
    # every hidden node is at most as recent as every shown one (hottest first)
    coldest_shown = min(r.last_access for r in snap.rows)
    assert all(r.last_access <= coldest_shown for r in full.rows if r.id not in shown)
    # hidden children are exactly the unshown children of shown nodes, with their pages
    for r in snap.rows:
        kids = [c for c in full.rows if c.parent == r.id and c.id not in shown]
        assert r.hidden_children == len(kids) and r.hidden_pages == sum(c.pages for c in kids)
    assert snap.shown_pages == sum(r.pages for r in snap.rows) < snap.cached_pages


def test_program_graph_fork_join_edges_and_states():
    t = ProgramTracker()
    t.record({"id": "r1", "name": "p", "branch": "0"}, ["a"])
    for i in range(3):
        t.record({"id": "r1", "branch": f"0/0.{i}", "parent": "0", "after": 1}, [f"b{i}"])
    t.record({"id": "r1", "branch": "0", "name": "p"}, ["c"])
    (g,) = t.graphs(running={"b1"}, waiting={"c"})
    assert g["name"] == "p" and [n["state"] for n in g["nodes"]] == \
        ["done", "done", "decoding", "done", "waiting"]
    assert sorted(map(tuple, g["edges"])) == sorted(
        [(0, 1, "fork"), (0, 2, "fork"), (0, 3, "fork"), (0, 4, "seq"),
         (1, 4, "join"), (2, 4, "join"), (3, 4, "join")])
    assert g["active"] == ["0/0.1"]


def test_program_graph_nested_fork_without_parent_generation():
    t = ProgramTracker()
    t.record({"id": "r", "branch": "0"}, ["x"])
    # branch 0/0.0 forks again before generating anything: the server never heard of it, so
    # its children hang from the nearest ancestor's generation (the root's)
    t.record({"id": "r", "branch": "0/0.0/0.0", "parent": "0/0.0", "after": 0}, ["y"])
    t.record({"id": "r", "branch": "0/0.0/0.1", "parent": "0/0.0", "after": 0}, ["z"])
    (g,) = t.graphs(set(), set())
    assert sorted(map(tuple, g["edges"])) == [(0, 1, "fork"), (0, 2, "fork")]


def test_program_tracker_keeps_recent_runs_only():
    t = ProgramTracker()
    for k in range(40):
        t.record({"id": f"run{k}", "branch": "0"}, [f"r{k}"])
    graphs = t.graphs(set(), set())
    assert len(graphs) == 16 and graphs[0]["id"] == "run39"


@pytest.mark.parametrize("tag,field", [
    ("x", "program"), ({}, "program.id"), ({"id": 3, "branch": "0"}, "program.id"),
    ({"id": "a"}, "program.branch"), ({"id": "a", "branch": ""}, "program.branch"),
    ({"id": "a", "branch": "0", "after": -1}, "program.after"),
    ({"id": "a", "branch": "0", "after": True}, "program.after"),
    ({"id": "a", "branch": "0", "name": 5}, "program.name"),
    ({"id": "a" * 300, "branch": "0"}, "program.id")])
def test_bad_program_tags_name_the_field(tag, field):
    with pytest.raises(APIError) as e:
        parse_tag(tag)
    assert e.value.status == 400 and e.value.param == field


def test_static_files_are_package_data():
    tomllib = pytest.importorskip("tomllib")      # Python >= 3.11
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = cfg["tool"]["setuptools"]["package-data"]["agentlang.runtime.server"]
    static = ROOT / "runtime" / "server" / "static"
    files = sorted(p.name for p in static.iterdir())
    assert files == ["dashboard.css", "dashboard.html", "dashboard.js"]
    for f in files:
        assert any(fnmatch.fnmatch(f"static/{f}", pat) for pat in patterns), f
    html = (static / "dashboard.html").read_text()
    assert "http://" not in html and "https://" not in html      # no CDN
    js = (static / "dashboard.js").read_text()
    assert "http://" not in js.replace("http://www.w3.org/2000/svg", "")


def test_evictions_are_recorded_with_namespace_and_size():
    cache = RadixCache(PageAllocator(16), page_size=2)
    ns = ("m", "torch.float32", "int8", "tenant-a")
    cache.release_into_cache([1, 2, 3, 4], cache.allocator.allocate(2), ns)
    cache.release_into_cache([1, 2, 5, 6, 7, 8], cache.allocator.allocate(3), ns)
    assert cache.evict(16) == 4          # [1,2] once, [3,4], [5..8]
    evs = list(cache.recent_evictions)
    assert sorted(e.tokens for e in evs) == [2, 2, 4] and all(e.namespace == ns for e in evs)
    assert cache.flush() == 0 and len(cache.recent_evictions) == 3   # a flush is no eviction


def test_namespace_label_shows_precision_and_hides_the_salt():
    from agentlang.runtime.engine.snapshot import namespace_label

    label = namespace_label(("SmolLM2", "torch.float32", "fp8_e4m3", "secret-tenant"))
    assert label["kv"] == "fp8_e4m3" and label["model"] == "SmolLM2"
    assert len(label["salt"]) == 8 and "secret" not in str(label)
    assert "salt" not in namespace_label(("SmolLM2", "torch.float32", "float32"))
